"""Instructions per scheduling decision, counted by valgrind's callgrind: immune to the machine's load.

    python -m loadtests.decision_instructions [--policy default predicted-latency] [--decisions 2000]

The wall-clock figures of `loadtests.decision_bench` carry whatever else the machine runs; the number
of instructions a decision executes does not. For each policy this runs itself under
`valgrind --tool=callgrind` (PYTHONHASHSEED=0, so dict probing is the same every run), builds the same
warm fleet and request mix as `decision_bench` (8k tokens, 16 replicas: `--tokens`, `--replicas`),
warms the interpreter with untimed decisions, then runs phases of `--decisions` calls each: a no-op
call (the loop's own cost, subtracted from every other phase), the whole decision (canonical bytes,
block keys, index match, context, `schedule`), each of its stages alone (the first four on the same
requests, `RequestInfo` and `SchedulingContext` construction as one), `schedule` alone, and each
filter, scorer and the picker alone on the full pool. Each phase runs on contexts of its own, with an
empty memo of latency quotes: a plugin alone prices what it asks for, while `schedule` shares the
quotes between the `latency-knee` filter and the `predicted-latency` scorer (the "quotes shared"
phase is that scorer reading the filter's). Before each phase and after the last it calls
`os.getppid()`, at which callgrind dumps its counters (`--dump-before=os_getppid`), so each phase has
a dump of its own (`callgrind_annotate --inclusive=yes FILE` shows where a phase's instructions went,
by C function).
Instructions are not time: they ignore cache misses and branch mispredictions.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from gateway.config_slo import DEFAULT_KNEE_FACTOR
from loadtests.decision_bench import BLOCK_BYTES, INDEX_BLOCK_TOKENS, MODEL, NOW, snapshots, warm_fleet
from policies.latency.estimator import LatencyEstimator
from policies.prefix import BYTES_PER_TOKEN, byte_block_keys, seed_for
from policies.prompt_text import canonical_chat_bytes
from policies.scheduling.builtin_profiles import build_builtin_profile
from policies.scheduling.context import SchedulingContext, latency_quotes
from policies.types import RequestInfo

MARKER = "os_getppid"  # the C function behind os.getppid(): nothing on the decision path calls it
WARMUP = 300
# Phases of the whole decision, not per candidate (the decision is these four and `schedule`).
WHOLE_PHASES = ("decision", "canonical bytes", "block keys", "index match", "RequestInfo + SchedulingContext",
                "schedule")  # fmt: skip


def phases(
    policy: str, tokens: int, replicas: int, decisions: int, seed: int,
    knee: float | None = DEFAULT_KNEE_FACTOR,
) -> list[tuple[str, Any]]:  # fmt: skip
    """(name, thunk) per phase; each thunk makes `decisions` calls. Built outside the counted phases."""
    rng = random.Random(seed * 1_000_003 + tokens * 101 + replicas)
    index, names, mix = warm_fleet(rng, tokens, replicas, requests=60)
    messages = [orjson.loads(orjson.dumps(m)) for m in mix]
    pools = snapshots(rng, names, 8)
    profile = build_builtin_profile(policy)
    latency = LatencyEstimator(INDEX_BLOCK_TOKENS)
    seed_key = seed_for(MODEL, None)
    pick_rng = random.Random(seed)

    def context(msgs: list[dict[str, Any]], n: int) -> SchedulingContext:
        data = canonical_chat_bytes(msgs)
        keys = byte_block_keys(data, BLOCK_BYTES, seed_key)
        info = RequestInfo(model=MODEL, base_model=MODEL, adapter=None,
                           prompt_tokens=len(data) // BYTES_PER_TOKEN, max_tokens=256, prefix_keys=keys)
        return SchedulingContext(request=info, now=NOW, prefix_match=index.match(keys, names),
                                 prefix_blocks=len(keys), sequence=n, stale_after_s=1.0,
                                 latency=latency, knee_factor=knee, quotes={})  # fmt: skip

    def decide(msgs: list[dict[str, Any]], pool: Any, n: int) -> Any:
        return profile.schedule(context(msgs, n), pool, pick_rng)

    items = [(messages[n % len(messages)], pools[n % len(pools)], n) for n in range(decisions)]
    for msgs, pool, n in items[:WARMUP]:  # the adaptive interpreter specialises the hot code first
        decide(msgs, pool, n)
    ctxs = [(context(m, n), pool) for m, pool, n in items]
    picks = [(c, profile.schedule(c, pool, pick_rng)) for c, pool in ctxs]

    def noop(a: object, b: object) -> None:
        return None

    def over_ctxs(f: Callable[[Any, Any], object], shared: bool = False) -> Callable[[], None]:
        """A phase calling `f` on each context, each with a memo of latency quotes of its own: empty
        (the phase prices what it asks for), or with `shared` filled as the knee filter leaves it."""
        mine = [(c._replace(quotes={}), pool) for c, pool in ctxs]
        if shared:
            for c, pool in mine:
                latency_quotes(c, pool)

        def run() -> None:
            for c, pool in mine:
                f(c, pool)

        return run

    def whole() -> None:
        for msgs, pool, n in items:
            decide(msgs, pool, n)

    datas = [canonical_chat_bytes(m) for m, _, _ in items]
    keyss = [byte_block_keys(d, BLOCK_BYTES, seed_key) for d in datas]
    matches = [index.match(k, names) for k in keyss]

    def canonical() -> None:
        for msgs, _, _ in items:
            canonical_chat_bytes(msgs)

    def block_keys() -> None:
        for data in datas:
            byte_block_keys(data, BLOCK_BYTES, seed_key)

    def match() -> None:
        for keys in keyss:
            index.match(keys, names)

    def request_context() -> None:
        for n, (data, keys, found) in enumerate(zip(datas, keyss, matches, strict=True)):
            info = RequestInfo(model=MODEL, base_model=MODEL, adapter=None,
                               prompt_tokens=len(data) // BYTES_PER_TOKEN, max_tokens=256, prefix_keys=keys)
            SchedulingContext(request=info, now=NOW, prefix_match=found, prefix_blocks=len(keys), sequence=n,
                              stale_after_s=1.0, latency=latency, knee_factor=knee, quotes={})  # fmt: skip

    def picker() -> None:
        pick = profile.picker.pick
        for c, d in picks:
            pick(c, d.scored, d.totals, pick_rng)

    out: list[tuple[str, Any]] = [
        ("loop", over_ctxs(noop)),
        ("decision", whole),
        ("canonical bytes", canonical),
        ("block keys", block_keys),
        ("index match", match),
        ("RequestInfo + SchedulingContext", request_context),
        ("schedule", over_ctxs(lambda c, pool: profile.schedule(c, pool, pick_rng))),
    ]
    out += [(f"filter {f.name}", over_ctxs(f.filter)) for f in profile.filters]
    out += [(f"scorer {w.scorer.name}", over_ctxs(w.scorer.score)) for w in profile.weighted_scorers]
    out.append((f"picker {profile.picker.name}", picker))
    scorers = {w.scorer.name: w.scorer for w in profile.weighted_scorers}
    if "predicted-latency" in scorers:
        if knee is not None and any(f.name == "latency-knee" for f in profile.filters):
            # As in `schedule`: the knee filter priced the candidates, the scorer reads its quotes.
            out.append(("scorer predicted-latency, quotes shared",
                        over_ctxs(scorers["predicted-latency"].score, shared=True)))  # fmt: skip

        # The model's part of the scorer (work_weight 1, as in the built-in profile).
        def costs(c: SchedulingContext, pool: Any) -> object:
            return latency.costs(pool, c.request.prompt_tokens, c.prefix_match, c.now, c.stale_after_s, 1.0)

        out.append(("LatencyEstimator.costs", over_ctxs(costs)))
    if latency_quotes_used(profile, knee):

        def price(c: SchedulingContext, pool: Any) -> object:
            return latency.price(pool, c.request.prompt_tokens, c.prefix_match, c.now, c.stale_after_s, {})

        out.append(("LatencyEstimator.price", over_ctxs(price)))
    return out


def latency_quotes_used(profile: Any, knee: float | None) -> bool:
    """The profile prices candidates with the latency models: the knee filter with a knee, or the scorer."""
    knee_filter = knee is not None and any(f.name == "latency-knee" for f in profile.filters)
    return knee_filter or any(w.scorer.name == "predicted-latency" for w in profile.weighted_scorers)


def child(args: argparse.Namespace) -> int:
    knee = args.knee_factor or None
    named = phases(args.policy[0], args.tokens, args.replicas, args.decisions, args.seed, knee)
    gc.collect()
    gc.freeze()  # the warm index is long-lived: collections need not walk it (as in a settled gateway)
    Path(args.names).write_text(json.dumps([n for n, _ in named]))
    for _, run in named:
        os.getppid()  # callgrind dumps here: the dump before the first phase holds the setup
        run()
    os.getppid()
    return 0


def instructions(path: Path) -> int:
    """The Ir total of one callgrind dump."""
    text = path.read_text()
    found = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.MULTILINE)
    if found is None:
        raise ValueError(f"no totals in {path}")
    return int(found.group(1))


def measure(policy: str, args: argparse.Namespace, out_dir: Path) -> list[tuple[str, float, Path]]:
    """(phase, instructions per call, its dump) for `policy`, the loop's cost subtracted."""
    names_file = out_dir / f"{policy}.phases.json"
    base = out_dir / f"callgrind.{policy}.out"
    cmd = [
        "valgrind", "--tool=callgrind", f"--dump-before={MARKER}", "--compress-strings=no",
        f"--callgrind-out-file={base}",
        sys.executable, "-m", "loadtests.decision_instructions", "--child", "--policy", policy,
        "--tokens", str(args.tokens), "--replicas", str(args.replicas),
        "--decisions", str(args.decisions), "--seed", str(args.seed), "--names", str(names_file),
        "--knee-factor", str(args.knee_factor),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONHASHSEED": "0"}, capture_output=True)
    names = json.loads(names_file.read_text())
    dumps = sorted(out_dir.glob(f"{base.name}.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
    # Dump 1 is the setup; dumps 2.. are the phases in order (then the exit's remainder).
    counted = [(name, instructions(dump), dump) for name, dump in zip(names, dumps[1:], strict=False)]
    loop = counted[0][1]
    return [(name, (total - loop) / args.decisions, dump) for name, total, dump in counted[1:]]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.decision_instructions", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--policy", nargs="+", default=["default", "predicted-latency"])
    parser.add_argument("--decisions", type=int, default=2000, help="calls per phase")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="keep the callgrind dumps here")
    parser.add_argument("--knee-factor", type=float, default=DEFAULT_KNEE_FACTOR,
                        help="the latency gate's knee in the context, as with the gate on (the default); "
                        "0 = gate off: the latency-knee filter keeps every candidate")  # fmt: skip
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--names", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="decision-instructions-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"{args.tokens} tokens, {args.replicas} replicas, {args.decisions} calls per phase; "
          f"instructions per call, the loop's own cost subtracted; dumps in {out_dir}")  # fmt: skip
    print()
    print("| policy | phase | instructions per call | per candidate |")
    print("|---|---|---|---|")
    for policy in args.policy:
        for name, per_call, _ in measure(policy, args, out_dir):
            whole = name in WHOLE_PHASES
            per_candidate = "" if whole else f"{per_call / args.replicas:,.0f}"
            print(f"| {policy} | {name} | {per_call:,.0f} | {per_candidate} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
