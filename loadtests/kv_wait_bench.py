"""Cost of `KvLedger.wait_s` (the KV-admission wait read once per dispatch) at 16/64/128 requests in
flight on a replica, on random ledgers (seed 0): "fits" (capacity 100k blocks: everything fits, the
common unloaded case) and "full" (capacity 60 blocks per request in flight: the queue is played).

    python -m loadtests.kv_wait_bench              # wall clock, best of 5 x 2000 calls (load-sensitive)
    PYTHONHASHSEED=0 valgrind --tool=callgrind --dump-before=os_getppid \\
        --callgrind-out-file=/tmp/kvw/cg.out python -m loadtests.kv_wait_bench --phases 200
        # instructions: dumps 2..7 hold the six cases in the order printed by the wall-clock run,
        # 200 calls each (`grep ^summary: FILE`, divide by 200); dump 1 is the setup.
"""

from __future__ import annotations

import argparse
import os
import random
import timeit

from policies.latency.kv_admission import KvLedger

BLOCK = 16
CASES = [(n, label) for n in (16, 64, 128) for label in ("fits", "full")]


def ledger(n: int, seed: int = 0) -> KvLedger:
    rng = random.Random(seed)
    led = KvLedger(key_tokens=16)
    for i in range(n):
        keys = [rng.randrange(4)] + [rng.randrange(3) for _ in range(rng.randrange(0, 20))]
        led.add(i, rng.randrange(100, 3000), rng.randrange(50, 500), rng.uniform(0, 2), keys,
                rng.randrange(0, 3000))  # fmt: skip
        if rng.random() < 0.7:
            led.first_token(i, rng.uniform(0, 1))
    return led


def capacity(n: int, label: str) -> int:
    return 100_000 if label == "fits" else n * 60


def read(led: KvLedger, cap: int) -> tuple[float, int]:
    return led.wait_s(1.0, 0.02, BLOCK, cap, 1500, (1, 0, 1, 2), 1e-4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phases", type=int, default=0,
                        help="under callgrind: calls per case, os.getppid() between cases")  # fmt: skip
    args = parser.parse_args()
    ledgers = [(n, label, ledger(n), capacity(n, label)) for n, label in CASES]
    if args.phases:
        for _, _, led, cap in ledgers:
            read(led, cap)  # warm
        for _, _, led, cap in ledgers:
            os.getppid()
            for _ in range(args.phases):
                read(led, cap)
        os.getppid()
        return
    for n, label, led, cap in ledgers:
        best = min(timeit.repeat(lambda: read(led, cap), number=2000, repeat=5)) / 2000  # noqa: B023
        print(f"n={n:4d} {label}: {best * 1e6:6.1f} us/call  wait={read(led, cap)}")


if __name__ == "__main__":
    main()
