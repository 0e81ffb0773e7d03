"""What the latency gate pays per replica to price a request: `ttft_s` alone against `gate_ttft_s` (its
wait for free KV blocks played on the replica's KV ledger), over a pool of `--replicas` replicas with
`--in-flight` requests each (4,352-token prompts of 24 prefix groups, 64 output tokens, most of them
running), on random ledgers (seed 0): "fits" (2,048 blocks of 16 tokens per in-flight request:
nothing waits, and `KvLedger.fits_at_full_length` says so in O(1)), "near" (one block short of what
that check needs: the new one fits by the tokens not generated yet, found by a pass over the
ledger), "short" (2,048 blocks per replica: the ledger's queue is played) and "mixed" (the first
replica as in "fits", the others as in "short").

    python -m loadtests.gate_bench [--replicas 16] [--in-flight 64]    # best of 5 x 200 passes

Wall-clock figures on a shared machine move by 2x between runs; instructions do not. One row alone,
untimed, for valgrind (instructions per pass: the total with `--passes 20`, less the total with
`--passes 0`, over 20):

    PYTHONHASHSEED=0 valgrind --tool=callgrind python -m loadtests.gate_bench --only mixed:room --passes 20

The gate plays the ledger only on replicas within its bound by `ttft_s` alone (gateway/latency_gate.py):
the "short" figure is its cost when every replica is. The `room` rows time the gate's own pricing of
the pool (`LatencyGate.room`, default knee; every request in flight running, so that each replica is
within the knee by `ttft_s` alone and its ledger is played), which cuts each play once the price
passes the bound by the least drain found so far, against the same with every play whole
(`room_whole`): the same room and drain, by construction and by
tests/policies/latency/test_kv_admission.py (checked again here).
"""

from __future__ import annotations

import argparse
import math
import random
import timeit
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.config import FlowControlConfig
from gateway.latency_gate import LatencyGate
from policies.latency.estimator import LatencyEstimator
from policies.latency_admission import LatencySlo
from policies.saturation import SaturationThresholds
from policies.types import ReplicaState

PROMPT = 4352
BLOCK = 16
CASES = ("fits", "near", "short", "mixed")


class WholePlays(LatencyEstimator):
    """The estimator with the gate's limit ignored: every play whole (the gate before the limit)."""

    def gate_ttft_s(
        self, state: ReplicaState, prompt_tokens: int, prefix_keys: tuple[int, ...], now: float,
        stale_after_s: float, ttft: float | None = None, limit_s: float = math.inf,
    ) -> float:  # fmt: skip
        return super().gate_ttft_s(state, prompt_tokens, prefix_keys, now, stale_after_s, ttft)


@dataclass
class _Pools:
    """What `LatencyGate` reads of `gateway.admission_pools.AdmissionPools`: the replicas, thresholds."""

    states: list[ReplicaState]
    thr: SaturationThresholds = field(
        default_factory=lambda: SaturationThresholds(max_waiting_per_replica=10_000, max_kv_usage=1.0,
                                                     max_in_flight_per_replica=10_000, stale_after_s=1.0)
    )  # fmt: skip

    def replicas(self) -> Sequence[ReplicaState]:
        return self.states


@dataclass
class _Share:
    def alone(self, now: float, depth_of: object) -> bool:
        return False

    def someone_outweighed(self, room: int, now: float, depth_of: object) -> bool:
        return False  # no light tenant beside a heavy one: every knee has its decode-step floor


@dataclass
class _Queue:
    depth_of: object = None


@dataclass
class _Pool:
    """What `LatencyGate.room` reads of `gateway.admission_pools.Pool`."""

    indexes: range
    pending: int = 0
    share: _Share = field(default_factory=_Share)
    queue: _Queue = field(default_factory=_Queue)


def pool(
    replicas: int,
    in_flight: int,
    blocks: int,
    seed: int = 0,
    whole: bool = False,
    started: float = 0.9,
    roomy_first: bool = False,
) -> tuple[LatencyEstimator, list[ReplicaState]]:
    """`replicas` replicas of `blocks` KV blocks each (the first with room for everything, with
    `roomy_first`), `in_flight` requests on each, `started` of them with their first token."""
    rng = random.Random(seed)
    est = WholePlays(BLOCK) if whole else LatencyEstimator(BLOCK)
    states = []
    for i in range(replicas):
        state = ReplicaState(
            name=f"r{i}", url=f"http://r{i}", pool="m", scraped_at=0.0,
            num_gpu_blocks=2048 * in_flight if roomy_first and i == 0 else blocks,
            block_size=BLOCK, in_flight=in_flight, in_flight_tokens=in_flight * (PROMPT + 64),
        )  # fmt: skip
        states.append(state)
        for j in range(in_flight):
            keys = tuple([rng.randrange(24)] + [rng.randrange(3) for _ in range(rng.randrange(0, 60))])
            ticket = est.dispatched(est.predict(state, 256, 0.0, 1.0, prompt_tokens=PROMPT, output_tokens=64,
                                                prefix_keys=keys))  # fmt: skip
            if rng.random() < started:
                est.prefilled(ticket)
                est.started(ticket, 0.01 * j)
    return est, states


def gate(est: LatencyEstimator, state: ReplicaState, keys: tuple[int, ...]) -> float:
    return est.gate_ttft_s(state, PROMPT, keys, 0.5, 1.0, est.ttft_s(state, PROMPT, 0.5, 1.0))


def runs(label: str, replicas: int, in_flight: int) -> list[tuple[str, Callable[[], object], str]]:
    """(name, one pass, the pool's KV waits) of each row of case `label`."""
    keys = tuple(range(PROMPT // BLOCK))
    # "near": one block short of what the O(1) check needs (every request in flight at its full
    # length, and the new one), so the new one fits only by the tokens not generated yet: found by a
    # pass over the ledger
    near = -(-(PROMPT + 64) // BLOCK) * in_flight + -(-PROMPT // BLOCK) - 1
    blocks = {"fits": 2048 * in_flight, "near": near, "short": 2048, "mixed": 2048}[label]
    mixed = label == "mixed"
    est, states = pool(replicas, in_flight, blocks, roomy_first=mixed)
    waits = [est.kv_wait_s(s, PROMPT, keys, 0.5, 1.0) for s in states]
    span = f"{min(waits):.3f}-{max(waits):.3f} s"
    out: list[tuple[str, Callable[[], object], str]] = [
        ("ttft_s", lambda: [est.ttft_s(s, PROMPT, 0.5, 1.0) for s in states], span),
        # as the gate calls it: `ttft_s` first, then the KV wait on top of it
        ("gate_ttft_s", lambda: [gate(est, s, keys) for s in states], span),
    ]
    answers = []
    for whole in (False, True):
        # every request in flight running: no queue ahead, so each replica is within the knee by
        # `ttft_s` alone and the gate plays its ledger (with 10% queued, most are not)
        gate_est, gate_states = pool(replicas, in_flight, blocks, whole=whole, started=1.0, roomy_first=mixed)
        g = LatencyGate(FlowControlConfig(), gate_est, _Pools(gate_states))  # type: ignore[arg-type]
        p = _Pool(range(len(gate_states)))

        def room(g: LatencyGate = g, p: _Pool = p) -> tuple[int, float]:
            return g.room(p, 0.5, PROMPT, LatencySlo(), False, keys)  # type: ignore[arg-type]

        answers.append(room())
        waits = [gate_est.kv_wait_s(s, PROMPT, keys, 0.5, 1.0) for s in gate_states]
        out.append(("room_whole" if whole else "room", room, f"{min(waits):.3f}-{max(waits):.3f} s"))
    assert answers[0] == answers[1], answers  # the cut plays price the pool as whole ones
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=16)
    p.add_argument("--in-flight", type=int, default=64)
    p.add_argument("--only", metavar="CASE:ROW", help="only this row, --passes times, untimed (callgrind)")
    p.add_argument("--passes", type=int, default=20)
    args = p.parse_args()
    if args.only:
        label, name = args.only.split(":")
        fn = next(fn for row, fn, _ in runs(label, args.replicas, args.in_flight) if row == name)
        fn()  # warm
        for _ in range(args.passes):
            fn()
        return
    for label in CASES:
        for name, fn, span in runs(label, args.replicas, args.in_flight):
            us = min(timeit.repeat(fn, number=200, repeat=5)) / 200 * 1e6
            print(
                f"{label:5s} {name:11s} {us:8.1f} us per pool of {args.replicas} "
                f"({us / args.replicas:6.1f} per replica; KV waits {span})"
            )


if __name__ == "__main__":
    main()
