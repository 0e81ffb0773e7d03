"""The bench's `summary.md`: the report's tables and knees, then the policy comparisons and the run's
setting (clock, fleet, process layout) with the simulator's own distortion and each process's CPU per
run, so a reader can tell whether the simulator, the load generator or the gateway shaped a number."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from loadtests.bench_compare import DEFAULT_PAIRS, compare, comparisons_markdown
from loadtests.presets import BenchPreset
from loadtests.report import write_report


def write_summary(doc: Mapping[str, Any], out_dir: Path, preset: BenchPreset) -> list[Path]:
    """`loadtests.report.write_report` (summary.md and the PNG plots), then the comparisons and the
    setting appended to summary.md; the paths written."""
    written = write_report(doc, out_dir)
    runs = doc["runs"]
    with (out_dir / "summary.md").open("a", encoding="utf-8") as f:
        f.write("\n" + comparisons_markdown(compare(runs, comparison_pairs(preset))))
        f.write("\n" + setting_markdown(doc["meta"], runs))
    return written


def comparison_pairs(preset: BenchPreset) -> list[tuple[str, str]]:
    """(policy, baseline) pairs for the summary: the standard ones, and each custom profile against
    round-robin and least-loaded."""
    pairs = list(DEFAULT_PAIRS)
    for name in preset.profiles:
        pairs += [(name, "round-robin"), (name, "least-loaded")]
    return pairs


def setting_markdown(meta: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> str:
    """The run's setting and the simulator's own distortion per run, as a `## Setting` section."""
    layout = meta.get("process_layout", {})
    fleet = meta.get("fleet", {})
    lines = [
        "## Setting",
        "",
        f"- clock: {meta.get('clock')}",
        f"- fleet: {fleet.get('replicas')} x {fleet.get('profile')}, {fleet.get('replica_kv_tokens')} KV "
        f"tokens per replica (the profile holds {fleet.get('profile_kv_tokens')}), time scale "
        f"{fleet.get('time_scale')}",
        f"- process layout: {layout.get('note')} (simulator CPUs {layout.get('simulator_cpus')}, gateway "
        f"{layout.get('gateway_cpus')}, load generator {layout.get('loadgen_cpus')})",
        f"- wall time: {meta.get('wall_s')} s",
        *(f"- note: {n}" for n in meta.get("notes", [])),
        "",
        "Simulator distortion and CPU per run (step lag in wall ms: how late engine steps started because "
        "the simulator's CPU was busy; clock jumps in simulated s, ⚠ above 2% of the replicas' measured "
        "time: the simulator fell behind and that run's latencies are stretched; CPU in cores; TTFT "
        "model error: p50 / p90 of the latency model's |predicted - actual| / actual TTFT over the "
        "point's streams, from the gateway's access log):",
        "",
        "| workload | policy | load | lag mean ms | lag p99 ≤ ms | clock jumps s | sim CPU | gateway CPU "
        "| gateway ms CPU/req | loadgen CPU | index keys | warm-up errors | TTFT model error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        load = f"c={r['concurrency']}" if r["mode"] == "closed" else f"{r['rate']:g}/s"

        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1e3:.2f}"

        def num(v: float | None, fmt: str = ".2f") -> str:
            return "-" if v is None else format(v, fmt)

        lines.append(
            f"| {r['workload']} | {r['policy']} | {load} | {ms(r.get('sim_step_lag_mean_s'))} | "
            f"{ms(r.get('sim_step_lag_p99_s'))} | {num(r.get('sim_clock_jump_s'), '.3f')}"
            f"{' ⚠' if r.get('sim_distorted') else ''} | "
            f"{num(r.get('sim_cpu_frac'))} | {num(r.get('gateway_cpu_frac'))} | "
            f"{num(r.get('gateway_cpu_ms_per_request'))} | {num(r.get('loadgen_cpu_frac'))} | "
            f"{num(r.get('gateway_index_keys'), '.0f')} | {r.get('warmup_errors', '-')} | "
            f"{_model_error(r.get('gateway_ttft_prediction_error'))} |"
        )
    return "\n".join(lines) + "\n"


def _model_error(err: Mapping[str, Any] | None) -> str:
    """`gateway_ttft_prediction_error` as "p50 / p90", or "-" (no gateway, or no stream scored)."""
    if not err or not err.get("n"):
        return "-"
    return f"{err['p50']:.3f} / {err['p90']:.3f}"
