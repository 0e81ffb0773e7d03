"""What the latency gate pays per replica to price a request: `ttft_s` alone against `gate_ttft_s` (its
wait for free KV blocks played on the replica's KV ledger), over a pool of `--replicas` replicas with
`--in-flight` requests each (4,352-token prompts of 24 prefix groups, 64 output tokens, most of them
running), on random ledgers (seed 0): "fits" (2,048 blocks of 16 tokens per in-flight request:
nothing waits, and `KvLedger.fits_at_full_length` says so in O(1)), "near" (one block short of what
that check needs: the new one fits by the tokens not generated yet, found by a pass over the
ledger) and "short" (2,048 blocks per replica: the ledger's queue is played).

    python -m loadtests.gate_bench [--replicas 16] [--in-flight 64]    # best of 5 x 200 passes

The gate plays the ledger only on replicas within its bound by `ttft_s` alone (gateway/latency_gate.py):
the "short" figure is its cost when every replica is.
"""

from __future__ import annotations

import argparse
import random
import timeit

from policies.latency.estimator import LatencyEstimator
from policies.types import ReplicaState

PROMPT = 4352
BLOCK = 16


def pool(
    replicas: int, in_flight: int, blocks: int, seed: int = 0
) -> tuple[LatencyEstimator, list[ReplicaState]]:
    rng = random.Random(seed)
    est = LatencyEstimator(BLOCK)
    states = []
    for i in range(replicas):
        state = ReplicaState(
            name=f"r{i}", url=f"http://r{i}", pool="m", scraped_at=0.0, num_gpu_blocks=blocks,
            block_size=BLOCK, in_flight=in_flight, in_flight_tokens=in_flight * (PROMPT + 64),
        )  # fmt: skip
        states.append(state)
        for j in range(in_flight):
            keys = tuple([rng.randrange(24)] + [rng.randrange(3) for _ in range(rng.randrange(0, 60))])
            ticket = est.dispatched(est.predict(state, 256, 0.0, 1.0, prompt_tokens=PROMPT, output_tokens=64,
                                                prefix_keys=keys))  # fmt: skip
            if rng.random() < 0.9:
                est.prefilled(ticket)
                est.started(ticket, 0.01 * j)
    return est, states


def gate(est: LatencyEstimator, state: ReplicaState, keys: tuple[int, ...]) -> float:
    return est.gate_ttft_s(state, PROMPT, keys, 0.5, 1.0, est.ttft_s(state, PROMPT, 0.5, 1.0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=16)
    p.add_argument("--in-flight", type=int, default=64)
    args = p.parse_args()
    keys = tuple(range(PROMPT // BLOCK))
    # "near": one block short of what the O(1) check needs (every request in flight at its full
    # length, and the new one), so the new one fits only by the tokens not generated yet: found by a
    # pass over the ledger
    near = -(-(PROMPT + 64) // BLOCK) * args.in_flight + -(-PROMPT // BLOCK) - 1
    for label, blocks in (("fits", 2048 * args.in_flight), ("near", near), ("short", 2048)):
        est, states = pool(args.replicas, args.in_flight, blocks)
        waits = [est.kv_wait_s(s, PROMPT, keys, 0.5, 1.0) for s in states]
        runs = (
            ("ttft_s", lambda e=est, ss=states: [e.ttft_s(s, PROMPT, 0.5, 1.0) for s in ss]),
            # as the gate calls it: `ttft_s` first, then the KV wait on top of it
            ("gate_ttft_s", lambda e=est, ss=states: [gate(e, s, keys) for s in ss]),
        )
        for name, fn in runs:
            us = min(timeit.repeat(fn, number=200, repeat=5)) / 200 * 1e6
            print(
                f"{label:5s} {name:11s} {us:8.1f} us per pool of {args.replicas} "
                f"({us / args.replicas:6.1f} per replica; KV waits {min(waits):.3f}-{max(waits):.3f} s)"
            )


if __name__ == "__main__":
    main()
