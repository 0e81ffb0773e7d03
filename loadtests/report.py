"""The benchmark report: a Markdown summary and PNG plots from a results document.

Curves are grouped by workload and loop mode (closed: load = concurrency; open: load = offered
requests/s), one curve per policy, its points ordered by load.

The knee of a curve (`find_knee`) is the highest load point before the curve bends: walking up the
loads, a point fails when its TTFT p90 exceeds `ttft_factor` (3) times the lowest load's, or when its
goodput (requests/s meeting the SLO) grows by less than `min_goodput_gain` (5%) over the previous
point's; the knee is the point before the first failure. When no point fails, the knee is the last
point and the sweep did not reach the bend (`reason` "end-of-sweep"). Past the knee, more load buys
mostly queueing.

Plots (matplotlib's Agg renderer through `Figure`, no pyplot state): TTFT p90 and TPOT p90 against
output tokens/s, goodput against load, and, where records carry tenants, per-tenant fairness at each
policy's highest load point (TTFT p95 per tenant; served against offered share).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from matplotlib.figure import Figure

KneeReason = Literal["ttft", "goodput", "end-of-sweep"]


@dataclass(frozen=True, slots=True)
class KneePoint:
    """One point of a curve: its load (concurrency or requests/s), TTFT p90 (seconds, None when no
    request succeeded) and goodput (requests/s)."""

    load: float
    ttft_p90_s: float | None
    goodput_rps: float


@dataclass(frozen=True, slots=True)
class Knee:
    """The knee: `index` into the points sorted by load, its `load`, and why the next point failed."""

    index: int
    load: float
    reason: KneeReason


def find_knee(
    points: Iterable[KneePoint], *, ttft_factor: float = 3.0, min_goodput_gain: float = 0.05
) -> Knee | None:
    """The knee of a curve (see the module docstring); None without points or when the lowest load
    has no TTFT to compare with."""
    ordered = sorted(points, key=lambda p: p.load)
    if not ordered or ordered[0].ttft_p90_s is None:
        return None
    limit = ttft_factor * ordered[0].ttft_p90_s
    for i in range(1, len(ordered)):
        point, previous = ordered[i], ordered[i - 1]
        if point.ttft_p90_s is None or point.ttft_p90_s > limit:
            return Knee(i - 1, previous.load, "ttft")
        if point.goodput_rps < previous.goodput_rps * (1 + min_goodput_gain):
            return Knee(i - 1, previous.load, "goodput")
    return Knee(len(ordered) - 1, ordered[-1].load, "end-of-sweep")


# --- grouping -------------------------------------------------------------------------------------

Curves = dict[str, list[dict[str, Any]]]  # policy -> records sorted by load


def load_of(record: Mapping[str, Any]) -> float:
    """A record's load: its concurrency (closed loop) or offered rate in requests/s (open loop)."""
    value = record["concurrency"] if record["mode"] == "closed" else record["rate"]
    return float(value)


def group_curves(runs: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Curves]:
    """Records grouped by (workload, mode) then policy, each curve sorted by load; groups and
    policies keep their first-seen order."""
    groups: dict[tuple[str, str], Curves] = {}
    for run in runs:
        curves = groups.setdefault((run["workload"], run["mode"]), {})
        curves.setdefault(run["policy"], []).append(dict(run))
    for curves in groups.values():
        for records in curves.values():
            records.sort(key=load_of)
    return groups


def curve_knee(records: Sequence[Mapping[str, Any]], **kwargs: float) -> Knee | None:
    """`find_knee` over records sorted by load."""
    return find_knee((KneePoint(load_of(r), r["ttft_p90_s"], r["goodput_rps"]) for r in records), **kwargs)


# --- Markdown -------------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.3g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _load_label(mode: str, load: float) -> str:
    return f"c={load:g}" if mode == "closed" else f"{load:g} req/s"


_COLUMNS = (
    "policy", "load", "TTFT p50 s", "TTFT p90 s", "TTFT p99 s", "TPOT p90 ms", "ITL p90 ms", "E2E p90 s",
    "out tok/s", "req/s", "goodput req/s", "prefix hits", "preempt", "errors", "429/503", "loadgen CPU",
)  # fmt: skip


def _row(mode: str, r: Mapping[str, Any], knee: Knee | None, index: int) -> str:
    load = _load_label(mode, load_of(r)) + (" ◀ knee" if knee is not None and knee.index == index else "")
    cpu = f"{r['loadgen_cpu_frac']:.2f}" + (" ⚠" if r["loadgen_bottleneck"] else "")
    cells = (
        r["policy"], load, _s(r["ttft_p50_s"]), _s(r["ttft_p90_s"]), _s(r["ttft_p99_s"]),
        _ms(r["tpot_p90_s"]), _ms(r["itl_p90_s"]), _s(r["e2e_p90_s"]), f"{r['output_tok_s']:.0f}",
        f"{r['requests_s']:.3g}", f"{r['goodput_rps']:.3g}", _pct(r["prefix_hit_rate"]),
        "-" if r["preemptions"] is None else str(r["preemptions"]), str(r["errors"]),
        f"{r['status_429']}/{r['status_503']}", cpu,
    )  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def _table(header: Sequence[str], rows: Iterable[str]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *rows]


def summary_markdown(doc: Mapping[str, Any]) -> str:
    """The Markdown summary of a results document: the run's setting, then per workload and mode a
    table of every policy x load point, each curve's knee, and per-tenant figures where present."""
    meta = doc["meta"]
    slo = meta.get("slo") or {}
    lines = [
        "# Benchmark summary",
        "",
        f"- started: {meta['started_at']}; kvgate commit: {meta.get('kvgate_commit') or 'unknown'}",
        f"- simulator profile: {meta.get('simulator_profile') or '-'}; time scale: "
        f"{meta.get('time_scale') if meta.get('time_scale') is not None else '-'}; "
        f"fleet size: {meta.get('fleet_size') or '-'}",
        "- SLO: " + (", ".join(f"{k.removesuffix('_s')} ≤ {v:g}s" for k, v in slo.items()) or "none"),
        f"- command: `{meta['command']}`",
        "",
        "Latencies are percentiles over successful requests (linear interpolation); rates are per "
        "second of the measured window. Knee: the highest load before TTFT p90 exceeds 3x its "
        "lowest-load value or goodput grows by less than 5%. ⚠ marks runs whose load generator used "
        "more than 0.8 of a core.",
    ]
    for (workload, mode), curves in group_curves(doc["runs"]).items():
        lines += ["", f"## {workload} ({'closed loop' if mode == 'closed' else 'open loop'})", ""]
        knees = {policy: curve_knee(records) for policy, records in curves.items()}
        rows = [
            _row(mode, r, knees[policy], i)
            for policy, records in curves.items()
            for i, r in enumerate(records)
        ]
        lines += _table(_COLUMNS, rows)
        lines += ["", "Knees:", ""]
        knee_rows = []
        for policy, knee in knees.items():
            if knee is None:
                knee_rows.append(f"| {policy} | - | no successful requests at the lowest load | - | - |")
                continue
            r = curves[policy][knee.index]
            knee_rows.append(
                f"| {policy} | {_load_label(mode, knee.load)} | {knee.reason} | {_s(r['ttft_p90_s'])} | "
                f"{r['goodput_rps']:.3g} |"
            )
        lines += _table(("policy", "knee", "next point failed on", "TTFT p90 s", "goodput req/s"), knee_rows)
        tenant_rows = [
            f"| {policy} | {_load_label(mode, load_of(r))} | {tenant} | {t['requests']} | "
            f"{_pct(t['offered_share'])} | {_pct(t['served_share'])} | {_s(t['ttft_p95_s'])} | "
            f"{t['status_429']} |"
            for policy, records in curves.items()
            for r in records
            for tenant, t in r["per_tenant"].items()
        ]
        if tenant_rows:
            lines += ["", "Per tenant:", ""]
            header = ("policy", "load", "tenant", "requests", "offered", "served", "TTFT p95 s", "429")
            lines += _table(header, tenant_rows)
    return "\n".join(lines) + "\n"


# --- plots ----------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _curve_plot(
    path: Path, title: str, curves: Curves, x_key: str, y_key: str, xlabel: str, ylabel: str, mode: str
) -> Path:
    # Fixed margins: a layout engine would draw every figure twice.
    fig = Figure(figsize=(7, 4.5))
    fig.subplots_adjust(left=0.11, right=0.97, top=0.92, bottom=0.12)
    ax = fig.add_subplot()
    for policy, records in curves.items():
        pts = [(r[x_key] if x_key != "load" else load_of(r), r[y_key]) for r in records]
        pts = [(x, y) for x, y in pts if y is not None]
        if not pts:
            continue
        (line,) = ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=policy)
        knee = curve_knee(records)
        if knee is not None and records[knee.index][y_key] is not None:
            r = records[knee.index]
            x = r[x_key] if x_key != "load" else load_of(r)
            ax.plot([x], [r[y_key]], marker="*", markersize=14, color=line.get_color(), linestyle="none")
    if x_key == "load" and mode == "closed":
        ax.set_xscale("log", base=2)
        loads = sorted({load_of(r) for records in curves.values() for r in records})
        ax.set_xticks(loads, [f"{v:g}" for v in loads])
        ax.minorticks_off()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(title="policy (★ knee)")
    fig.savefig(path, dpi=110)
    return path


def _fairness_plot(path: Path, title: str, curves: Curves) -> Path | None:
    top = {policy: records[-1] for policy, records in curves.items() if records[-1]["per_tenant"]}
    if not top:
        return None
    tenants = sorted({t for r in top.values() for t in r["per_tenant"]})
    fig = Figure(figsize=(11, 4.5))
    fig.subplots_adjust(left=0.07, right=0.98, top=0.84, bottom=0.1, wspace=0.22)
    left, right = fig.subplots(1, 2)
    width = 0.8 / len(top)
    for k, (policy, r) in enumerate(top.items()):
        xs = [i + k * width for i in range(len(tenants))]
        per = r["per_tenant"]
        left.bar(xs, [(per.get(t, {}).get("ttft_p95_s") or 0.0) for t in tenants], width=width, label=policy)
        right.bar(xs, [per.get(t, {}).get("served_share", 0.0) for t in tenants], width=width, label=policy)
    offered = [
        max((r["per_tenant"].get(t, {}).get("offered_share", 0.0) for r in top.values()), default=0.0)
        for t in tenants
    ]
    centers = [i + 0.4 - width / 2 for i in range(len(tenants))]
    right.scatter(centers, offered, marker="_", s=600, color="black", label="offered share", zorder=3)
    right.axhline(1 / len(tenants), color="grey", linestyle=":", label="fair share")
    for ax, ylabel in ((left, "TTFT p95 (s)"), (right, "share of output tokens")):
        ax.set_xticks(centers, tenants)
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="small")
    left.set_title("per-tenant TTFT p95 at the highest load")
    right.set_title("served vs offered share")
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    return path


def write_report(doc: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write `summary.md` and the PNG plots for `doc` into `out_dir` (created); the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = out_dir / "summary.md"
    summary.write_text(summary_markdown(doc), encoding="utf-8")
    written = [summary]
    for (workload, mode), curves in group_curves(doc["runs"]).items():
        stem = _slug(f"{workload}-{mode}")
        label = f"{workload} ({mode} loop)"
        load_label = "concurrency" if mode == "closed" else "offered rate (req/s)"
        written.append(
            _curve_plot(
                out_dir / f"{stem}-ttft_p90.png", f"TTFT p90 vs throughput - {label}", curves,
                "output_tok_s", "ttft_p90_s", "output tokens/s", "TTFT p90 (s)", mode,
            )
        )  # fmt: skip
        written.append(
            _curve_plot(
                out_dir / f"{stem}-tpot_p90.png", f"TPOT p90 vs throughput - {label}", curves,
                "output_tok_s", "tpot_p90_s", "output tokens/s", "TPOT p90 (s)", mode,
            )
        )  # fmt: skip
        written.append(
            _curve_plot(
                out_dir / f"{stem}-goodput.png", f"Goodput - {label}", curves,
                "load", "goodput_rps", load_label, "goodput (req/s meeting the SLO)", mode,
            )
        )  # fmt: skip
        fairness = _fairness_plot(out_dir / f"{stem}-fairness.png", f"Per-tenant fairness - {label}", curves)
        if fairness is not None:
            written.append(fairness)
    return written
