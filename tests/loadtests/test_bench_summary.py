"""The bench's summary: the report, then comparisons (custom profiles included) and the setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadtests.bench_summary import comparison_pairs, setting_markdown, write_summary
from loadtests.measures import LoadgenUsage, summarize
from loadtests.presets import get_preset
from loadtests.results import make_meta, make_record


def _record(policy: str, c: int) -> dict[str, Any]:
    rec = make_record(
        policy=policy, workload="random", measures=summarize([], warmup_end=0.0),
        loadgen=LoadgenUsage(0.1, 1.0, 1), concurrency=c,
    ).as_dict()  # fmt: skip
    rec.update(sim_step_lag_mean_s=0.0012, sim_step_lag_p99_s=0.005, sim_clock_jump_s=0.25, sim_cpu_frac=0.3,
               gateway_cpu_frac=0.2, gateway_cpu_ms_per_request=1.5, loadgen_cpu_frac=0.1,
               gateway_index_keys=42.0, warmup_errors=0)  # fmt: skip
    return rec


def test_custom_profiles_are_compared_with_both_baselines() -> None:
    preset = get_preset("weights")
    pairs = comparison_pairs(preset)
    for name in preset.profiles:
        assert (name, "round-robin") in pairs and (name, "least-loaded") in pairs
    assert ("default", "round-robin") in pairs


def test_setting_lists_each_runs_distortion_and_cpu() -> None:
    meta = make_meta(command="kvgate bench", slo=None, clock="simulated", fleet={"replicas": 2},
                     process_layout={"note": "2 CPUs"}, notes=["a note"])  # fmt: skip
    text = setting_markdown(meta, [_record("default", 4)])
    assert "2 CPUs" in text and "- note: a note" in text
    assert "| random | default | c=4 | 1.20 | 5.00 | 0.250 | 0.30 | 0.20 | 1.50 | 0.10 | 42 | 0 | - |" in text
    err = "gateway_ttft_prediction_error"
    scored = {**_record("default", 16), err: {"n": 40, "p50": 0.0512, "p90": 0.31}}
    unscored = {**_record("default", 64), err: {"n": 0, "p50": None, "p90": None}}
    text = setting_markdown(meta, [scored, unscored])
    assert "| c=16 | " in text and "| 42 | 0 | 0.051 / 0.310 |" in text
    assert text.count("| 42 | 0 | - |") == 1  # the unscored one
    distorted = setting_markdown(meta, [{**_record("default", 4), "sim_distorted": True}])
    assert "| 0.250 ⚠ |" in distorted


def test_write_summary_appends_comparisons_and_setting(tmp_path: Path) -> None:
    meta = make_meta(command="kvgate bench", slo=None)
    doc = {"meta": meta, "runs": [_record("least-loaded", 4), _record("default", 4)]}
    written = write_summary(doc, tmp_path, get_preset("quick"))
    text = (tmp_path / "summary.md").read_text()
    assert text.index("# Benchmark summary") < text.index("## Comparisons") < text.index("## Setting")
    assert "### random (closed loop): default vs least-loaded" in text
    assert any(p.suffix == ".png" for p in written)
