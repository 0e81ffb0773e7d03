"""Policy against baseline, from one results document: ratios per load point, at the knees, and the
issue's targets checked at the baseline's knee.

A ratio is policy / baseline on the same workload, loop mode and load: TTFT p90 (lower is better),
goodput (requests/s meeting the SLO), prefix cache hit rate and output tokens/s (higher is better).
"At the knee" is at the load of the baseline's knee (`loadtests.report.curve_knee`): the most load
the baseline carries before it bends, where a better policy should show its worth; the policy's own
knee is shown too. Records are compared only within one document, i.e. one run on one fleet, so that
slow drift of a shared machine cancels as far as it can.

Targets (issue #5): on `shared-prefix`, default vs round-robin: TTFT p90 <= 0.5x, goodput >= 1.5x,
hit rate >= 2x; on `random`, default vs least-loaded within 5% (goodput >= 0.95x, TTFT p90 <= 1.05x).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadtests.report import curve_knee, group_curves, load_of


@dataclass(frozen=True, slots=True)
class Target:
    """`metric` ratio (policy / baseline) compared to `bound` with `op` ("<=" or ">=")."""

    metric: str
    op: str
    bound: float

    def met(self, ratio: float | None) -> bool | None:
        if ratio is None:
            return None
        check: Callable[[float, float], bool] = operator.le if self.op == "<=" else operator.ge
        return check(ratio, self.bound)

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.bound:g}x"


# (workload, policy, baseline) -> targets at the baseline's knee.
TARGETS: Mapping[tuple[str, str, str], tuple[Target, ...]] = {
    ("shared-prefix", "default", "round-robin"): (
        Target("ttft_p90_s", "<=", 0.5),
        Target("goodput_rps", ">=", 1.5),
        Target("prefix_hit_rate", ">=", 2.0),
    ),
    ("random", "default", "least-loaded"): (
        Target("goodput_rps", ">=", 0.95),
        Target("ttft_p90_s", "<=", 1.05),
    ),
}

DEFAULT_PAIRS: tuple[tuple[str, str], ...] = (
    ("default", "round-robin"),
    ("default", "least-loaded"),
    ("random", "least-loaded"),
)

METRICS: tuple[str, ...] = ("ttft_p90_s", "goodput_rps", "prefix_hit_rate", "output_tok_s")


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b; None when either is missing or b is 0."""
    if a is None or b is None or b == 0:
        return None
    return a / b


@dataclass(frozen=True, slots=True)
class ComparisonRow:
    """Ratios at one load; `marks` says whose knee this load is ("baseline knee", "policy knee") and
    flags a pair measured while the simulator fell behind (records' `sim_distorted`)."""

    load: float
    ratios: Mapping[str, float | None]
    marks: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Comparison:
    workload: str
    mode: str
    policy: str
    baseline: str
    rows: tuple[ComparisonRow, ...]
    baseline_knee: float | None
    policy_knee: float | None
    targets: tuple[Target, ...]

    def at_baseline_knee(self) -> ComparisonRow | None:
        return next((r for r in self.rows if r.load == self.baseline_knee), None)

    def verdicts(self) -> list[tuple[Target, float | None, bool | None]]:
        """Each target with the measured ratio at the baseline's knee and whether it is met (None:
        not measured)."""
        row = self.at_baseline_knee()
        values = [row.ratios.get(t.metric) if row else None for t in self.targets]
        return [(t, v, t.met(v)) for t, v in zip(self.targets, values, strict=True)]


def compare(
    runs: Iterable[Mapping[str, Any]], pairs: Sequence[tuple[str, str]] = DEFAULT_PAIRS
) -> list[Comparison]:
    """Every (policy, baseline) pair present in `runs`, per workload and loop mode."""
    out: list[Comparison] = []
    for (workload, mode), curves in group_curves(runs).items():
        for policy, baseline in pairs:
            if policy not in curves or baseline not in curves:
                continue
            mine = {load_of(r): r for r in curves[policy]}
            base = {load_of(r): r for r in curves[baseline]}
            bk, pk = curve_knee(curves[baseline]), curve_knee(curves[policy])
            rows = []
            for load in sorted(set(mine) & set(base)):
                marks = tuple(
                    m
                    for m, k in (("baseline knee", bk), ("policy knee", pk))
                    if k is not None and k.load == load
                )
                if mine[load].get("sim_distorted") or base[load].get("sim_distorted"):
                    marks += ("⚠ simulator distorted",)
                ratios = {m: ratio(mine[load][m], base[load][m]) for m in METRICS}
                rows.append(ComparisonRow(load, ratios, marks))
            out.append(
                Comparison(
                    workload, mode, policy, baseline, tuple(rows),
                    bk.load if bk else None, pk.load if pk else None,
                    TARGETS.get((workload, policy, baseline), ()),
                )
            )  # fmt: skip
    return out


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def comparisons_markdown(comparisons: Sequence[Comparison]) -> str:
    """The comparison tables and target verdicts, as Markdown (a `## Comparisons` section)."""
    lines = [
        "## Comparisons",
        "",
        "Ratios are policy / baseline at the same load, from this run only: TTFT p90 (< 1 is better), "
        "goodput, prefix cache hit rate and output tokens/s (> 1 is better). Targets are checked at the "
        "baseline's knee.",
    ]
    for c in comparisons:
        loop = "closed loop" if c.mode == "closed" else "open loop"
        lines += ["", f"### {c.workload} ({loop}): {c.policy} vs {c.baseline}", ""]
        lines += ["| load | TTFT p90 | goodput | hit rate | out tok/s | knee |", "|---|---|---|---|---|---|"]
        for r in c.rows:
            label = f"c={r.load:g}" if c.mode == "closed" else f"{r.load:g} req/s"
            cells = [_x(r.ratios[m]) for m in METRICS]
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {', '.join(r.marks)} |")
        for target, value, met in c.verdicts():
            verdict = "not measured" if met is None else ("met" if met else "MISSED")
            lines.append(f"\nTarget {target}: {_x(value)} - {verdict}")
    return "\n".join(lines) + "\n"
