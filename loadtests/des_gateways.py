"""`python -m loadtests.des_gateways`: hit rate, goodput, TTFT p90 and herding vs the number of gateways.

N kvgate processes in front of one simulated fleet (`loadtests.des.gateways`: each its own prefix
index, in-flight ledger and scrape phases; requests spread round robin), for each fleet size, workload,
gateway count and seed, with two pickers on the same request stream in the same run:

- `default`: kvgate's default profile (its `near-best` picker, the anti-herding fix);
- `max-score`: the same profile with the `max-score` picker it had before;
- with `--with-random`, `near-best-random`: the fix without its prefix hash (`hash_blocks: 0`: the
  winner among the near-best always drawn by the rng), to see what the hash adds.

Each case is one `loadtests.des_cli` run (its workload factory, warm-up and load semantics): the
`--warmup-fraction` share of the requests unmeasured, then one closed-loop point at
`--concurrency-per-replica` x replicas. Shared-prefix runs use `--groups-per-replica` x replicas groups
(so the prefixes need a fixed share of the fleet's KV whatever its size); multi-turn runs have one
conversation per `--turns` requests. Every result record is appended to `--out` (JSON lines) as it
ends; `--summarize FILE` prints the tables of a finished (or partial) file: per case, median and worst
seed of each figure per picker, and the fix's ratios to `max-score` per seed (median and worst).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from loadtests import des_cli
from policies.scheduling.builtin_profiles import builtin_profile_spec

FIX, BEFORE, RANDOM = "default", "max-score", "near-best-random"
LABELS = {BEFORE: "max-score (before)", RANDOM: "near-best, rng only", FIX: "near-best (fix)"}
# (record key, label, higher is better)
FIGURES: tuple[tuple[str, str, bool], ...] = (
    ("prefix_hit_rate", "hit rate", True),
    ("goodput_rps", "goodput req/s", True),
    ("ttft_p90_s", "TTFT p90 s", False),
    ("skew_p99", "in-flight skew p99", False),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtests.des_gateways", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--replicas", default="64", help="fleet sizes, comma-separated (64)")
    p.add_argument("--gateways", default="1,2,4,8,16", help="gateway counts, comma-separated (1,2,4,8,16)")
    p.add_argument("--workloads", default="shared-prefix,multi-turn")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--requests-per-replica", type=int, default=100, help="measured requests per replica")
    p.add_argument("--warmup-fraction", type=float, default=0.25, help="of the measured count, unmeasured")
    p.add_argument("--concurrency-per-replica", type=int, default=8)
    p.add_argument("--groups-per-replica", type=int, default=4, help="shared-prefix groups per replica")
    p.add_argument("--kv-blocks", type=int, default=2048, help="KV blocks of 16 tokens per replica")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--system-prompt-tokens", type=int, default=1024)
    p.add_argument("--question-tokens", type=int, default=64, help="shared-prefix")
    p.add_argument("--user-tokens", type=int, default=64, help="multi-turn")
    p.add_argument("--turns", type=int, default=4, help="multi-turn")
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--spread", choices=("round-robin", "random"), default="round-robin")
    p.add_argument("--ledger", choices=("local", "shared"), default="local",
                   help="shared: every gateway counts every dispatch at once (a what-if)")
    p.add_argument("--with-random", action="store_true", help="also run near-best-random")
    p.add_argument("--fix-only", action="store_true", help="only the default profile (no max-score)")
    p.add_argument("--index", choices=("approximate", "exact"), default="approximate",
                   help="each gateway's prefix index (exact: fed by every engine's KV events)")
    p.add_argument("--event-lag", type=float, default=0.005, help="exact index: simulated seconds")
    p.add_argument("--tokenizer", choices=("none", "sim"), default=None,
                   help="the pool's tokenizer (exact implies sim)")
    p.add_argument("--slo", default="ttft=250ms,tpot=50ms", help="goodput thresholds")
    p.add_argument("--out", type=Path, default=None, help="append result records here (JSON lines)")
    p.add_argument("--summarize", type=Path, default=None, help="print the tables of FILE and exit")
    return p


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def gateway_config() -> dict[str, Any]:
    """A gateway config adding `max-score` (the default profile with the picker it had before) and
    `near-best-random` (the default profile, its picker without the prefix hash)."""
    before = builtin_profile_spec("default")
    before["picker"] = {"type": "max-score"}
    rng_only = builtin_profile_spec("default")
    params = {**rng_only["picker"].get("params", {}), "hash_blocks": 0}
    rng_only["picker"] = {"type": "near-best", "params": params}
    return {"scheduling": {"profiles": {BEFORE: before, RANDOM: rng_only}}}


def case_argv(args: argparse.Namespace, replicas: int, workload: str, gateways: int, seed: int,
              config: Path) -> list[str]:  # fmt: skip
    """The `des_cli` arguments of one case."""
    requests = args.requests_per_replica * replicas
    argv = [
        "--replicas", str(replicas), "--kv-blocks", str(args.kv_blocks),
        "--max-num-seqs", str(args.max_num_seqs), "--workload", workload,
        "--system-prompt-tokens", str(args.system_prompt_tokens),
        "--question-tokens", str(args.question_tokens), "--user-tokens", str(args.user_tokens),
        "--turns", str(args.turns), "--output-tokens", str(args.output_tokens),
        "--requests", str(requests), "--warmup-requests", str(int(requests * args.warmup_fraction)),
        "--concurrency", str(args.concurrency_per_replica * replicas),
        "--gateways", str(gateways), "--spread", args.spread, "--ledger", args.ledger,
        "--policy", FIX if args.fix_only else f"{FIX},{BEFORE}" + (f",{RANDOM}" if args.with_random else ""),
        "--gateway-config", str(config), "--slo", args.slo,
        "--seed", str(seed), "--no-progress",
        "--index", args.index, "--event-lag", str(args.event_lag),
    ]  # fmt: skip
    if args.tokenizer is not None:
        argv += ["--tokenizer", args.tokenizer]
    if workload == "shared-prefix":
        argv += ["--groups", str(args.groups_per_replica * replicas)]
    return argv


def row(record: dict[str, Any], replicas: int, gateways: int, seed: int) -> dict[str, Any]:
    """The figures of one run, flat."""
    skew = record["des"]["in_flight_skew"]
    return {
        "replicas": replicas, "workload": record["workload"], "gateways": gateways, "seed": seed,
        "policy": record["policy"], "index": record["des"]["views"]["index"],
        "prefix_hit_rate": record["prefix_hit_rate"],
        "goodput_rps": record["goodput_rps"], "ttft_p90_s": record["ttft_p90_s"],
        "ttft_p50_s": record["ttft_p50_s"], "completed": record["completed"],
        "skew_p99": skew["p99"], "skew_max": skew["max"],
        "cpu_s": record["des"]["cpu_s"],
    }  # fmt: skip


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gateway.yaml"
        config.write_text(yaml.safe_dump(gateway_config(), sort_keys=False))
        for replicas in _ints(args.replicas):
            for workload in [w.strip() for w in args.workloads.split(",") if w.strip()]:
                for gateways in _ints(args.gateways):
                    for seed in _ints(args.seeds):
                        argv = case_argv(args, replicas, workload, gateways, seed, config)
                        print(f"# {replicas} replicas, {workload}, {gateways} gateways, seed {seed}",
                              flush=True)
                        records = des_cli.run(des_cli.build_parser().parse_args(argv), "des_gateways")
                        new = [row(r, replicas, gateways, seed) for r in records]
                        rows += new
                        if args.out is not None:
                            with args.out.open("a") as f:
                                f.writelines(json.dumps(r) + "\n" for r in new)
    return rows


def _fmt(key: str, value: float | None) -> str:
    if value is None:
        return "-"
    if key == "prefix_hit_rate":
        return f"{value:.1%}"
    if key == "ttft_p90_s":
        return f"{value:.3f}"
    return f"{value:.1f}"


def summarize(rows: Iterable[dict[str, Any]]) -> str:
    """Markdown tables: figures per picker (median, worst seed) and each picker's ratios to
    `max-score`, seed by seed (median, worst)."""
    cases: dict[tuple[int, str], dict[int, dict[str, dict[int, dict[str, Any]]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(dict))
    )
    for r in rows:
        cases[(r["replicas"], r["workload"])][r["gateways"]][r["policy"]][r["seed"]] = r
    out: list[str] = []
    for (replicas, workload), by_n in sorted(cases.items()):
        out.append(f"\n**{replicas} replicas, {workload}** (median, worst seed in brackets)\n")
        head = " | ".join(label for _, label, _ in FIGURES)
        ratios = " | ".join(f"{label} ratio" for _, label, _ in FIGURES)
        out.append(f"| gateways | picker | seeds | {head} | {ratios} |")
        out.append("|" + "---|" * (3 + 2 * len(FIGURES)))
        for n, by_policy in sorted(by_n.items()):
            for policy in (BEFORE, RANDOM, FIX):
                seeds = by_policy.get(policy, {})
                if not seeds:
                    continue
                cells = [_cell(key, [s[key] for s in seeds.values()], better) for key, _, better in FIGURES]
                if policy != BEFORE:
                    ratio_cells = [_ratio_cell(key, seeds, by_policy.get(BEFORE, {}), better)
                                   for key, _, better in FIGURES]  # fmt: skip
                else:
                    ratio_cells = [""] * len(FIGURES)
                row_cells = " | ".join(cells + ratio_cells)
                out.append(f"| {n} | {LABELS[policy]} | {len(seeds)} | {row_cells} |")
    return "\n".join(out)


def _cell(key: str, values: Sequence[float | None], better_high: bool) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    worst = min(known) if better_high else max(known)
    return f"{_fmt(key, statistics.median(known))} ({_fmt(key, worst)})"


def _ratio_cell(key: str, fix: dict[int, dict[str, Any]], before: dict[int, dict[str, Any]],
                better_high: bool) -> str:  # fmt: skip
    ratios = []
    for seed, r in fix.items():
        b = before.get(seed)
        if b is not None and r[key] is not None and b[key]:
            ratios.append(r[key] / b[key])
    if not ratios:
        return "-"
    worst = min(ratios) if better_high else max(ratios)
    return f"{statistics.median(ratios):.2f} ({worst:.2f})"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.summarize is not None:
        rows = [json.loads(line) for line in args.summarize.read_text().splitlines() if line.strip()]
        print(summarize(rows))
        return 0
    print("# python -m loadtests.des_gateways " + shlex.join(sys.argv[1:] if argv is None else list(argv)))
    print(summarize(run(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
