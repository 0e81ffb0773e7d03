"""Scheduling decision benchmark: time and memory of the prefix-aware routing decision, no network.

    python -m loadtests.decision_bench [--decisions 3000] [--profile] [--no-memory] [--policy NAME]

One decision = what the gateway does per request before forwarding: canonical prompt bytes of a chat
body, chained block keys (64-token index blocks = 256 bytes), `PrefixIndex.match` over the pool,
`RequestInfo` and `SchedulingContext` (with the per-replica latency models, as the gateway's), and
`schedule` with the default profile (`--policy`: another built-in). Prompts of 1k, 8k and
32k tokens (English-like text at ~4 bytes per token: a system prompt, a few turns, a question) over 4,
16 and 64 replicas, against a warm index: every replica is filled to its capacity (25,000 engine
blocks x 16 tokens / 64 = 6,250 index blocks) with conversations of its system-prompt groups plus
unrelated prefixes, and requests are a mix of next turns of recorded conversations (a long match on
one replica), new conversations on a shared system prompt (a partial match on about two replicas), and
cold prompts. Each body is parsed (untimed) right before its decision, as in the gateway. Timed with
`perf_counter_ns` (wall) and `thread_time_ns` (CPU) per decision, garbage collector on.

The memory part fills 64 replicas x 25,000 engine blocks at index blocks of 16 and 64 tokens with
distinct keys (the worst case: no sharing) and reads tracemalloc, plus the cost of a key held by a
second replica. The machine's load average is printed: other processes inflate wall-clock tails.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import platform
import pstats
import random
import statistics
import time
import tracemalloc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.config_slo import DEFAULT_KNEE_FACTOR
from loadtests.workloads.text import WordText
from policies.latency.estimator import LatencyEstimator
from policies.prefix import BYTES_PER_TOKEN, byte_block_keys, seed_for
from policies.prefix_index import PrefixIndex, capacity_blocks
from policies.prompt_text import canonical_chat_bytes
from policies.scheduling.builtin_profiles import build_builtin_profile
from policies.scheduling.context import SchedulingContext
from policies.scheduling.profile import SchedulingProfile
from policies.types import ReplicaState, RequestInfo

MODEL = "llama-3-8b"
INDEX_BLOCK_TOKENS = 64
BLOCK_BYTES = INDEX_BLOCK_TOKENS * BYTES_PER_TOKEN
ENGINE_BLOCKS = 25_000  # Llama-3-8B on one H100 (DESIGN.md)
ENGINE_BLOCK_SIZE = 16
SIZES = (1024, 8192, 32768)
FLEETS = (4, 16, 64)
NOW = 10_000.0

Messages = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Row:
    tokens: int
    replicas: int
    blocks: int
    p50_us: float
    p90_us: float
    p99_us: float
    max_us: float
    cpu_p50_us: float  # thread CPU time: immune to time spent descheduled on a busy machine
    cpu_p99_us: float
    isolated_p50_us: float  # best of five back-to-back repeats per decision
    isolated_p99_us: float
    stage_p50_us: dict[str, float]
    record_p50_us: float
    matched_share: float  # mean over requests of the best replica's matched blocks / blocks


class Conversations:
    """Chat bodies of about `tokens` tokens: 40% system prompt, 55% earlier turns, 5% question."""

    def __init__(self, rng: random.Random, tokens: int, groups: int) -> None:
        self._rng = rng
        self._text = WordText()
        self.tokens = tokens
        self.systems = [self._text.text(rng, tokens * 40 // 100) for _ in range(groups)]

    def history(self) -> Messages:
        turns = 4
        per_turn = self.tokens * 55 // 100 // (2 * turns)
        out: Messages = []
        for _ in range(turns):
            out.append({"role": "user", "content": self._text.text(self._rng, per_turn)})
            out.append({"role": "assistant", "content": self._text.text(self._rng, per_turn)})
        return out

    def question(self) -> dict[str, Any]:
        return {"role": "user", "content": self._text.text(self._rng, max(8, self.tokens * 5 // 100))}

    def conversation(self, group: int) -> Messages:
        return [{"role": "system", "content": self.systems[group]}, *self.history(), self.question()]


def keys_of(messages: Messages) -> tuple[int, ...]:
    return byte_block_keys(canonical_chat_bytes(messages), BLOCK_BYTES, seed_for(MODEL, None))


def warm_fleet(
    rng: random.Random, tokens: int, replicas: int, requests: int
) -> tuple[PrefixIndex, list[str], list[Messages]]:
    """An index with every replica full, and a request mix against it."""
    groups = max(4, replicas)
    convs = Conversations(rng, tokens, groups)
    names = [f"replica-{i:02d}" for i in range(replicas)]
    capacity = capacity_blocks(ENGINE_BLOCKS, ENGINE_BLOCK_SIZE, INDEX_BLOCK_TOKENS)
    index = PrefixIndex(default_capacity=capacity)
    # Unrelated prefixes first (oldest), so the conversations below are the most recent entries.
    for name in names:
        filled = 0
        while filled < capacity:
            chunk = tuple(rng.getrandbits(64) for _ in range(min(128, capacity - filled)))
            index.record(name, chunk)
            filled += len(chunk)
    recorded: list[tuple[Messages, str]] = []
    for i, name in enumerate(names):
        for group in (i % groups, (i + 1) % groups):  # each system prompt lives on about two replicas
            for _ in range(2):
                conv = convs.conversation(group)
                index.record(name, keys_of(conv))
                recorded.append((conv, name))
    mix: list[Messages] = []
    for n in range(requests):
        kind = n % 3
        if kind == 0:  # the next turn of a recorded conversation
            conv, _ = recorded[rng.randrange(len(recorded))]
            mix.append([*conv, {"role": "assistant", "content": "Sure."}, convs.question()])
        elif kind == 1:  # a new conversation on a shared system prompt
            mix.append(convs.conversation(rng.randrange(groups)))
        else:  # cold
            cold = Conversations(rng, tokens, 1)
            mix.append(cold.conversation(0))
    return index, names, mix


def snapshots(rng: random.Random, names: Sequence[str], count: int) -> list[tuple[ReplicaState, ...]]:
    """Pools with varied load, all healthy and fresh (the filters keep everyone: the costly case)."""
    out = []
    for _ in range(count):
        out.append(
            tuple(
                ReplicaState(
                    name=n,
                    url=f"http://{n}:8000",
                    pool=MODEL,
                    scraped_at=NOW - rng.uniform(0.0, 0.2),
                    running=rng.randrange(0, 64),
                    waiting=rng.randrange(0, 4),
                    kv_usage=rng.uniform(0.2, 0.9),
                    in_flight=rng.randrange(0, 24),
                    in_flight_tokens=rng.randrange(0, 200_000),
                    block_size=ENGINE_BLOCK_SIZE,
                    num_gpu_blocks=ENGINE_BLOCKS,
                )
                for n in names
            )
        )
    return out


def decision_context(
    data: bytes, keys: tuple[int, ...], match: Mapping[str, float], n: int, latency: LatencyEstimator,
    knee: float | None,
) -> SchedulingContext:
    """The request and its scheduling context as the gateway builds them for decision `n` of a cell:
    `data` the canonical prompt bytes, `keys` their block keys, `match` the index's answer for them."""
    info = RequestInfo(
        model=MODEL,
        base_model=MODEL,
        adapter=None,
        prompt_tokens=len(data) // BYTES_PER_TOKEN,
        max_tokens=256,
        prefix_keys=keys,
    )
    return SchedulingContext(
        request=info, now=NOW, prefix_match=match, prefix_blocks=len(keys), sequence=n, stale_after_s=1.0,
        latency=latency, knee_factor=knee, quotes={},
    )  # fmt: skip


def run_cell(
    tokens: int, replicas: int, decisions: int, seed: int, profile: SchedulingProfile,
    knee: float | None = DEFAULT_KNEE_FACTOR,
) -> Row:  # fmt: skip
    rng = random.Random(seed * 1_000_003 + tokens * 101 + replicas)
    index, names, mix = warm_fleet(rng, tokens, replicas, requests=60)
    # Request bodies as they arrive: parsed just before the decision (untimed), so the prompt text is
    # in the CPU cache as it is in the gateway, while the index is as cold as a big index is.
    bodies = [orjson.dumps({"model": MODEL, "messages": m}) for m in mix]
    pools = snapshots(rng, names, 8)
    pick_rng = random.Random(seed)
    latency = LatencyEstimator(INDEX_BLOCK_TOKENS)  # priors only: a calibrated one costs the same
    seed_key = seed_for(MODEL, None)
    clock = time.perf_counter_ns
    cpu_clock = time.thread_time_ns
    cpu_overhead = _cpu_clock_overhead()
    totals: list[int] = []
    cpu: list[int] = []
    stages: dict[str, list[int]] = {"canonical": [], "keys": [], "match": [], "schedule": []}
    records: list[int] = []
    shares: list[float] = []

    def decide(messages: Messages, pool: tuple[ReplicaState, ...], n: int) -> tuple[int, ...]:
        """One decision; returns its five stage timestamps (ns) and the best match in blocks."""
        t0 = clock()
        data = canonical_chat_bytes(messages)
        t1 = clock()
        keys = byte_block_keys(data, BLOCK_BYTES, seed_key)
        t2 = clock()
        match = index.match(keys, names)
        t3 = clock()
        ctx = decision_context(data, keys, match, n, latency, knee)
        decision = profile.schedule(ctx, pool, pick_rng)
        t4 = clock()
        if n % 10 == 0 and decision.replica is not None:
            # Record occasionally: the dispatch-time cost, without letting the mix drift into all-hits.
            index.record(decision.replica.name, keys)
            records.append(clock() - t4)
        return t0, t1, t2, t3, t4, max(match.values(), default=0), len(keys)

    warmup = min(200, decisions // 5)
    for n in range(warmup + decisions):
        messages = orjson.loads(bodies[n % len(bodies)])["messages"]
        pool = pools[n % len(pools)]
        c0 = cpu_clock()
        t0, t1, t2, t3, t4, matched, blocks = decide(messages, pool, n)
        c1 = cpu_clock()
        if n < warmup:
            continue
        shares.append(matched / blocks if blocks else 0.0)
        totals.append(t4 - t0)
        cpu.append(c1 - c0 - cpu_overhead)
        stages["canonical"].append(t1 - t0)
        stages["keys"].append(t2 - t1)
        stages["match"].append(t3 - t2)
        stages["schedule"].append(t4 - t3)
    # The same decisions, each repeated five times back to back keeping the best: what a decision
    # costs when no other process takes the core or the cache from it (an optimistic bound).
    isolated = []
    for n in range(min(decisions, 300)):
        pool = pools[n % len(pools)]
        best = None
        for _ in range(5):
            messages = orjson.loads(bodies[n % len(bodies)])["messages"]
            t0, _, _, _, t4, _, _ = decide(messages, pool, n + 1)  # n + 1: no extra records
            best = t4 - t0 if best is None else min(best, t4 - t0)
        isolated.append(best or 0)
    q = statistics.quantiles(totals, n=100, method="inclusive")
    qc = statistics.quantiles(cpu, n=100, method="inclusive")
    qi = statistics.quantiles(isolated, n=100, method="inclusive")
    return Row(
        tokens=tokens,
        replicas=replicas,
        blocks=statistics.median_low(len(keys_of(m)) for m in mix),
        p50_us=q[49] / 1000,
        p90_us=q[89] / 1000,
        p99_us=q[98] / 1000,
        max_us=max(totals) / 1000,
        cpu_p50_us=qc[49] / 1000,
        cpu_p99_us=qc[98] / 1000,
        isolated_p50_us=qi[49] / 1000,
        isolated_p99_us=qi[98] / 1000,
        stage_p50_us={k: statistics.median(v) / 1000 for k, v in stages.items()},
        record_p50_us=statistics.median(records) / 1000 if records else 0.0,
        matched_share=statistics.fmean(shares),
    )


def _cpu_clock_overhead() -> int:
    """Median ns that a thread_time_ns pair around two perf_counter_ns calls adds to a reading."""
    cpu_clock, clock = time.thread_time_ns, time.perf_counter_ns
    samples = []
    for _ in range(2000):
        c0 = cpu_clock()
        clock()
        clock()
        samples.append(cpu_clock() - c0)
    return int(statistics.median(samples))


def reference_loop_us() -> float:
    """Best time of an empty 1,000-iteration Python loop: a yardstick for this machine at this moment."""
    best = float("inf")
    items = list(range(1000))
    for _ in range(200):
        started = time.perf_counter_ns()
        for _ in items:
            pass
        best = min(best, time.perf_counter_ns() - started)
    return best / 1000


def memory_rows(seed: int) -> list[str]:
    """Index memory for 64 replicas x 25,000 engine blocks, distinct keys, at index blocks 16 and 64."""
    lines = [
        "| index block (tokens) | capacity / replica | entries (64 replicas) | traced MB | bytes / entry "
        "| estimated_bytes() MB | full gc.collect() ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for block_tokens in (16, 64):
        rng = random.Random(seed)
        capacity = capacity_blocks(ENGINE_BLOCKS, ENGINE_BLOCK_SIZE, block_tokens)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        index = PrefixIndex(default_capacity=capacity)
        for r in range(64):
            name = f"replica-{r:02d}"
            filled = 0
            while filled < capacity:
                chunk = tuple(rng.getrandbits(64) for _ in range(min(256, capacity - filled)))
                index.record(name, chunk)
                filled += len(chunk)
        del chunk
        traced = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        started = time.perf_counter()
        gc.collect()
        gc_ms = (time.perf_counter() - started) * 1000
        entries = index.entries()
        lines.append(
            f"| {block_tokens} | {capacity:,} | {entries:,} | {traced / 1e6:.1f} | {traced / entries:.0f} "
            f"| {index.estimated_bytes() / 1e6:.1f} | {gc_ms:.1f} |"
        )
        del index
    lines.append("")
    lines.append(shared_key_cost(seed))
    return lines


def shared_key_cost(seed: int) -> str:
    """Bytes for a key on one replica, and for the same key recorded on a second replica too."""
    rng = random.Random(seed)
    keys = tuple(rng.getrandbits(64) for _ in range(200_000))
    gc.collect()
    tracemalloc.start()
    index = PrefixIndex(default_capacity=len(keys))
    for start in range(0, len(keys), 128):
        index.record("a", keys[start : start + 128])
    one = tracemalloc.get_traced_memory()[0]
    for start in range(0, len(keys), 128):
        index.record("b", keys[start : start + 128])
    two = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    # The keys tuple was built before tracing: this counts the index's containers only, and key int
    # objects shared with the caller (the gateway's RequestInfo.prefix_keys keeps them alive anyway
    # while a request runs; afterwards the index holds the only reference).
    per_key = one / len(keys)
    per_second_holder = (two - one) / len(keys)
    return (
        f"A key on one replica: {per_key:.0f} B (index containers; + 36 B for the key's int object once "
        f"the request is gone); the same key on a second replica: +{per_second_holder:.0f} B."
    )


def profile_cell(tokens: int, replicas: int, decisions: int, seed: int, profile: SchedulingProfile) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    run_cell(tokens, replicas, decisions, seed, profile)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.decision_bench", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--decisions", type=int, default=3000, help="timed decisions per cell")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="cProfile the 8k-token / 16-replica cell")
    parser.add_argument("--no-memory", action="store_true", help="skip the 64 x 25k-block memory part")
    parser.add_argument("--tokens", type=int, nargs="*", default=list(SIZES), help="prompt sizes (tokens)")
    parser.add_argument("--replicas", type=int, nargs="*", default=list(FLEETS), help="fleet sizes")
    parser.add_argument("--policy", default="default", help="built-in scheduling profile to time")
    parser.add_argument("--knee-factor", type=float, default=DEFAULT_KNEE_FACTOR,
                        help="the latency gate's knee in the context, as with the gate on (the default); "
                        "0 = gate off: the latency-knee filter keeps every candidate")  # fmt: skip
    args = parser.parse_args(argv)

    profile = build_builtin_profile(args.policy)
    if args.profile:
        profile_cell(8192, 16, args.decisions, args.seed, profile)
        return 0
    load = os.getloadavg()
    print(
        f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.decisions} decisions per cell, "
        f"index block {INDEX_BLOCK_TOKENS} tokens = {BLOCK_BYTES} bytes, {args.policy} profile; "
        f"reference loop (1,000 empty iterations) {reference_loop_us():.1f} µs"
    )
    print()
    print(
        "| prompt tokens | replicas | blocks | p50 µs | p90 µs | p99 µs | max µs | CPU p50 µs | CPU p99 µs "
        "| isolated p50 / p99 µs | canonical / keys / match / schedule p50 µs | record p50 µs | best match |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    cpu0 = time.process_time()
    for tokens in args.tokens:
        for replicas in args.replicas:
            row = run_cell(tokens, replicas, args.decisions, args.seed, profile, args.knee_factor or None)
            s = row.stage_p50_us
            print(
                f"| {row.tokens:,} | {row.replicas} | {row.blocks} | {row.p50_us:.1f} | {row.p90_us:.1f} "
                f"| {row.p99_us:.1f} | {row.max_us:.0f} | {row.cpu_p50_us:.1f} | {row.cpu_p99_us:.1f} "
                f"| {row.isolated_p50_us:.1f} / {row.isolated_p99_us:.1f} "
                f"| {s['canonical']:.1f} / {s['keys']:.1f} / {s['match']:.1f} / {s['schedule']:.1f} "
                f"| {row.record_p50_us:.1f} | {row.matched_share:.0%} |",
                flush=True,
            )
    print(
        f"\n(decision cells took {time.process_time() - cpu0:.1f} s of CPU including warm-up; reference loop "
        f"now {reference_loop_us():.1f} µs, load average {os.getloadavg()[0]:.2f})"
    )
    if not args.no_memory:
        print()
        for line in memory_rows(args.seed):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
