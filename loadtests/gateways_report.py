"""The live gateways bench's report (`loadtests.gateways_bench`): per-cell helpers and the summary.

- `group_placement(traces)`: how a run placed each group (prefix group or conversation): distinct
  replicas per group, and moves (a group's request sent to another replica than its previous one,
  in send order), from the `x-kvgate-replica` header each trace keeps.
- `index_modes(metrics_text)`: replica -> "exact" | "approximate", from `kvgate_prefix_index_mode`.
- `summary_markdown(records)` / `write_summary(dir)`: per workload, one row per index and gateway
  count: median and worst seed of hit rate, goodput and TTFT p90, and each seed's figure over the
  same seed's one-gateway figure with the same index (median, worst; 3 decimals, as a target like
  ">= 95%" is checked on them); then the machine figures
  (gateway CPU, the simulator's step lag, load average) so a reader can see the machine was not the
  bottleneck, and per row the seeds whose cell was `distorted` (the simulator fell behind: its clock
  jumped, as `kvgate bench` flags it).
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtests.bench import DISTORTED_JUMP_SHARE
from loadtests.measures import RequestTrace

# (record key, label, higher is better)
FIGURES: tuple[tuple[str, str, bool], ...] = (
    ("prefix_hit_rate", "hit rate", True),
    ("goodput_rps", "goodput req/s", True),
    ("ttft_p90_s", "TTFT p90 s", False),
)


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    groups: int
    replicas_mean: float
    moves: int


def group_placement(traces: Iterable[RequestTrace]) -> GroupPlacement:
    """Per group (traces with a `group` and a `replica`), in send order: distinct replicas, moves."""
    by_group: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for t in traces:
        if t.group is not None and t.replica is not None:
            by_group[t.group].append((t.start, t.replica))
    moves = 0
    distinct = 0
    for sent in by_group.values():
        sent.sort()
        distinct += len({r for _, r in sent})
        moves += sum(1 for (_, a), (_, b) in itertools.pairwise(sent) if a != b)
    n = len(by_group)
    return GroupPlacement(n, distinct / n if n else 0.0, moves)


def index_modes(metrics_text: str) -> dict[str, str]:
    """Replica -> the mode whose `kvgate_prefix_index_mode` sample is 1."""
    out: dict[str, str] = {}
    for line in metrics_text.splitlines():
        if not line.startswith("kvgate_prefix_index_mode{"):
            continue
        labels = dict(
            part.split("=", 1)
            for part in line[line.find("{") + 1 : line.rfind("}")].split(",")
            if "=" in part
        )
        if float(line.rsplit(None, 1)[1]) == 1.0:
            out[labels["replica"].strip('"')] = labels["mode"].strip('"')
    return out


def _fmt(key: str, value: float) -> str:
    if key == "prefix_hit_rate":
        return f"{value:.1%}"
    if key == "ttft_p90_s":
        return f"{value:.3f}"
    return f"{value:.2f}"


def _median_worst(values: Sequence[float], better_high: bool, fmt: Any) -> str:
    if not values:
        return "-"
    worst = min(values) if better_high else max(values)
    return f"{fmt(statistics.median(values))} ({fmt(worst)})"


def distorted(record: Mapping[str, Any], replicas: int) -> bool:
    """The simulator fell behind in this cell: its engine clocks skipped more than
    `bench.DISTORTED_JUMP_SHARE` of the replicas' measured simulated time (as `kvgate bench` flags)."""
    return float(record["sim_clock_jump_s"]) > DISTORTED_JUMP_SHARE * replicas * float(record["duration_s"])


def summary_markdown(records: Iterable[Mapping[str, Any]], replicas: int) -> str:
    """The tables (module docstring); `replicas` is the fleet's size (for the distortion flag)."""
    cells: dict[str, dict[tuple[str, int], dict[int, Mapping[str, Any]]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for r in records:
        cells[r["workload"]][(r["index"], r["gateways"])][r["seed"]] = r
    out: list[str] = []
    for workload, by_cell in sorted(cells.items()):
        out.append(f"\n**{workload}** (median over seeds, worst seed in brackets)\n")
        head = " | ".join(label for _, label, _ in FIGURES)
        ratios = " | ".join(f"{label} / 1 gw" for _, label, _ in FIGURES)
        tail = "group moves | errors | distorted seeds"
        out.append(f"| index | gateways | seeds | {head} | {ratios} | {tail} |")
        out.append("|" + "---|" * (6 + 2 * len(FIGURES)))
        for (index, n), seeds in sorted(by_cell.items()):
            figures = []
            for key, _, high in FIGURES:
                vals = [float(s[key]) for s in seeds.values() if s[key] is not None]
                figures.append(_median_worst(vals, high, lambda v, k=key: _fmt(k, v)))
            base = by_cell.get((index, 1), {})
            ratio_cells = []
            for key, _, high in FIGURES:
                rs = [float(s[key]) / float(base[seed][key]) for seed, s in seeds.items()
                      if n != 1 and seed in base and s[key] is not None and base[seed][key]]  # fmt: skip
                ratio_cells.append(_median_worst(rs, high, lambda v: f"{v:.3f}") if rs else "")
            moves = _median_worst(
                [float(s["group_moves"]) for s in seeds.values()], False, lambda v: f"{v:.0f}"
            )
            errors = sum(int(s["errors"]) + int(s["incomplete"]) for s in seeds.values())
            bad = ",".join(str(seed) for seed, s in sorted(seeds.items()) if distorted(s, replicas)) or "-"
            cols = " | ".join([*figures, *ratio_cells, moves, str(errors), bad])
            out.append(f"| {index} | {n} | {len(seeds)} | {cols} |")
        rows = [s for seeds in by_cell.values() for s in seeds.values()]
        lags = [s["sim_step_lag_p99_s"] for s in rows if s["sim_step_lag_p99_s"] is not None]
        exact = [s for s in rows if s["index"] == "exact"]
        all_exact = sum(1 for s in exact if s["exact_replicas_before"] == s["exact_replicas_after"] > 0)
        out.append(
            f"\nMachine, over these {len(rows)} cells: gateway CPU (all its processes) at most "
            f"{max(s['gateway_cpu_frac'] for s in rows):.2f} cores, simulator at most "
            f"{max(s['sim_cpu_frac'] for s in rows):.2f}, load generator at most "
            f"{max(s['loadgen_cpu_frac'] for s in rows):.2f}; simulator step lag p99 at most "
            f"{max(lags) if lags else float('nan'):g} s (wall), clock jumps at most "
            f"{max(s['sim_clock_jump_s'] for s in rows):.3f} simulated s; exact cells with every replica "
            f"exact before and after the run: {all_exact}/{len(exact)}; load average 1 min at cell ends "
            f"{min(s['loadavg_end'] for s in rows):.2f}-{max(s['loadavg_end'] for s in rows):.2f}."
        )
    return "\n".join(out)


def load_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_summary(out_dir: Path) -> str:
    """Write `out_dir/summary.md` from `out_dir/results.jsonl`; the markdown."""
    path = out_dir / "results.jsonl"
    replicas = int(json.loads((out_dir / "meta.json").read_text())["fleet"]["replicas"])
    text = summary_markdown(load_records(path), replicas) if path.exists() else "(no results)"
    (out_dir / "summary.md").write_text(text.lstrip() + "\n")
    return text
