from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loadtests.report import Knee, KneePoint, find_knee, group_curves, summary_markdown, write_report
from loadtests.results import make_meta, validate_results
from loadtests.slo import Slo


def pts(*rows: tuple[float, float | None, float]) -> list[KneePoint]:
    return [KneePoint(load, ttft, goodput) for load, ttft, goodput in rows]


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        ([], None),
        (pts((1, None, 0.0), (2, 0.1, 1.0)), None),  # nothing to compare with
        (pts((1, 0.1, 1.0)), Knee(0, 1, "end-of-sweep")),
        (pts((1, 0.1, 1.0), (2, 0.11, 2.0), (4, 0.12, 3.9)), Knee(2, 4, "end-of-sweep")),
        # TTFT p90 passes 3x the lowest load's (0.3) at load 8
        (pts((1, 0.1, 1.0), (2, 0.12, 2.0), (4, 0.2, 3.8), (8, 0.31, 7.0)), Knee(2, 4, "ttft")),
        (pts((1, 0.1, 1.0), (2, 0.12, 2.0), (4, 0.3, 3.8)), Knee(2, 4, "end-of-sweep")),  # 3x exactly holds
        # goodput stops growing (by >= 5%) at load 8 although TTFT is fine
        (pts((1, 0.1, 1.0), (2, 0.1, 2.0), (4, 0.15, 3.9), (8, 0.2, 4.0)), Knee(2, 4, "goodput")),
        (pts((1, 0.1, 1.0), (2, 0.1, 0.9)), Knee(0, 1, "goodput")),
        (pts((1, 0.1, 1.0), (2, None, 0.0)), Knee(0, 1, "ttft")),  # every request failed at load 2
        # unordered input is sorted by load first
        (pts((8, 0.31, 7.0), (1, 0.1, 1.0), (4, 0.2, 3.8), (2, 0.12, 2.0)), Knee(2, 4, "ttft")),
    ],
)
def test_find_knee(points: list[KneePoint], expected: Knee | None) -> None:
    assert find_knee(points) == expected


def test_find_knee_thresholds_are_parameters() -> None:
    curve = pts((1, 0.1, 1.0), (2, 0.25, 2.0), (4, 0.3, 2.1))
    assert find_knee(curve) == Knee(2, 4, "end-of-sweep")
    assert find_knee(curve, ttft_factor=2.0) == Knee(0, 1, "ttft")
    assert find_knee(curve, min_goodput_gain=0.1) == Knee(1, 2, "goodput")


def record(
    policy: str, workload: str, load: float, ttft: float, goodput: float, **extra: Any
) -> dict[str, Any]:
    closed = extra.pop("mode", "closed") == "closed"
    base: dict[str, Any] = {
        "policy": policy, "workload": workload, "mode": "closed" if closed else "open",
        "concurrency": int(load) if closed else None, "rate": None if closed else load,
        "burstiness": None if closed else 1.0, "warmup_s": 1.0, "requests": 100, "completed": 100,
        "incomplete": 0, "duration_s": 10.0,
        "ttft_p50_s": ttft / 2, "ttft_p90_s": ttft, "ttft_p99_s": ttft * 1.5,
        "tpot_p50_s": 0.02, "tpot_p90_s": 0.03, "tpot_p99_s": 0.04,
        "itl_p50_s": 0.02, "itl_p90_s": 0.03, "itl_p99_s": 0.05,
        "e2e_p50_s": 1.0, "e2e_p90_s": 2.0, "e2e_p99_s": 3.0,
        "output_tok_s": goodput * 100, "requests_s": goodput, "goodput_rps": goodput,
        "goodput_tok_s": goodput * 100, "prefix_hit_rate": 0.5, "cached_token_fraction": None,
        "preemptions": 0, "errors": 0, "status_429": 0, "status_503": 0, "error_kinds": {},
        "per_tenant": {}, "loadgen_cpu_frac": 0.1, "loadgen_cpu_ms_per_request": 0.3,
        "loadgen_bottleneck": False,
    }  # fmt: skip
    base.update(extra)
    return base


def tenants(noisy_ttft: float) -> dict[str, dict[str, Any]]:
    def one(share: float, served: float, ttft: float) -> dict[str, Any]:
        return {
            "requests": 10, "completed": 10, "errors": 0, "status_429": 0, "ttft_p50_s": ttft,
            "ttft_p90_s": ttft, "ttft_p95_s": ttft, "ttft_p99_s": ttft, "e2e_p90_s": 1.0, "output_tok_s": 5.0,
            "goodput_rps": 1.0, "offered_share": share, "served_share": served,
        }  # fmt: skip

    return {"noisy": one(0.7, 0.6, noisy_ttft), "quiet": one(0.3, 0.4, 0.1)}


def results_doc() -> dict[str, Any]:
    runs = []
    for policy, ttfts, goodputs in (
        ("round-robin", (0.1, 0.2, 0.5), (1.0, 1.9, 2.0)),
        ("kvgate", (0.05, 0.06, 0.1), (1.0, 2.0, 3.9)),
    ):
        for load, ttft, goodput in zip((1, 2, 4), ttfts, goodputs, strict=True):
            runs.append(record(policy, "shared-prefix", load, ttft, goodput))
    runs.append(record("kvgate", "random", 2, 0.1, 2.0, loadgen_bottleneck=True, loadgen_cpu_frac=0.9))
    runs.append(record("kvgate", "random", 1, 0.1, 1.0, prefix_hit_rate=None, preemptions=None))
    runs.append(record("kvgate", "noisy-neighbour", 5.0, 0.2, 4.0, mode="open", per_tenant=tenants(0.5)))
    runs.append(record("fair", "noisy-neighbour", 5.0, 0.2, 4.0, mode="open", per_tenant=tenants(0.3)))
    meta = make_meta(
        command="kvgate bench --preset quick",
        slo=Slo(ttft_s=1.0),
        simulator_profile="tiny",
        time_scale=10.0,
        fleet_size=4,
    )
    doc = {"meta": meta, "runs": runs}
    validate_results(doc)
    return doc


def test_group_curves_sorts_each_curve_by_load() -> None:
    doc = results_doc()
    groups = group_curves(doc["runs"])
    assert list(groups) == [("shared-prefix", "closed"), ("random", "closed"), ("noisy-neighbour", "open")]
    assert [r["concurrency"] for r in groups[("random", "closed")]["kvgate"]] == [1, 2]


def test_summary_table() -> None:
    text = summary_markdown(results_doc())
    assert "## shared-prefix (closed loop)" in text and "## noisy-neighbour (open loop)" in text
    assert "simulator profile: tiny; time scale: 10.0; fleet size: 4" in text
    assert "SLO: ttft ≤ 1s" in text and "`kvgate bench --preset quick`" in text
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| policy | load |"))
    assert "TTFT p90 s" in header and "goodput req/s" in header and "prefix hits" in header
    # round robin bends at c=4 (TTFT 0.5 > 3 x 0.1): knee at c=2; kvgate never bends
    assert "| round-robin | c=2 ◀ knee | 0.1 | 0.2 | 0.3 |" in text
    assert "| round-robin | c=2 | ttft | 0.2 | 1.9 |" in text
    assert "| kvgate | c=4 | end-of-sweep | 0.1 | 3.9 |" in text
    flagged = "| kvgate | c=2 ◀ knee | 0.05 | 0.1 | 0.15 | 30 | 30 | 2 | 200 | 2 | 2 | 50.0% | 0 | 0 | 0/0 |"
    assert flagged + " 0.90 ⚠ |" in text
    assert "| kvgate | c=1 | 0.05 | 0.1 | 0.15 | 30 | 30 | 2 | 100 | 1 | 1 | - | - | 0 | 0/0 | 0.10 |" in text
    assert "| kvgate | 5 req/s | noisy | 10 | 70.0% | 60.0% | 0.5 | 0 |" in text
    assert "Per tenant:" in text and text.count("Per tenant:") == 1


def test_write_report_writes_summary_and_plots(tmp_path: Path) -> None:
    written = write_report(results_doc(), tmp_path / "report")
    names = sorted(p.name for p in written)
    assert names == sorted(
        [
            "summary.md",
            *(
                f"{w}-closed-{k}.png"
                for w in ("shared-prefix", "random")
                for k in ("ttft_p90", "tpot_p90", "goodput")
            ),
            *(f"noisy-neighbour-open-{k}.png" for k in ("ttft_p90", "tpot_p90", "goodput", "fairness")),
        ]
    )
    for path in written:
        assert path.exists() and path.stat().st_size > 0
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
