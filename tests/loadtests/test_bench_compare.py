"""Policy-vs-baseline comparisons on hand-made records: ratios, knees, target verdicts, Markdown."""

from __future__ import annotations

from typing import Any

import pytest

from loadtests.bench_compare import Target, compare, comparisons_markdown, ratio


def _rec(
    policy: str, workload: str, c: int, ttft: float | None, goodput: float, hits: float | None
) -> dict[str, Any]:
    return {
        "policy": policy,
        "workload": workload,
        "mode": "closed",
        "concurrency": c,
        "rate": None,
        "ttft_p90_s": ttft,
        "goodput_rps": goodput,
        "prefix_hit_rate": hits,
        "output_tok_s": goodput * 10,
    }


# round-robin bends after c=4 (TTFT at c=16 is over 3x that at c=1); default keeps going.
RUNS = [
    _rec("round-robin", "shared-prefix", 1, 0.10, 1.0, 0.2),
    _rec("round-robin", "shared-prefix", 4, 0.20, 3.0, 0.2),
    _rec("round-robin", "shared-prefix", 16, 2.00, 3.1, 0.2),
    _rec("default", "shared-prefix", 1, 0.05, 1.2, 0.6),
    _rec("default", "shared-prefix", 4, 0.08, 4.8, 0.7),
    _rec("default", "shared-prefix", 16, 0.12, 12.0, 0.7),
    _rec("least-loaded", "random", 4, 0.20, 3.0, 0.0),
    _rec("default", "random", 4, 0.21, 2.9, 0.0),
]


def test_ratios_per_load_with_knee_marks() -> None:
    (sp,) = [c for c in compare(RUNS) if c.workload == "shared-prefix"]
    assert (sp.policy, sp.baseline, sp.baseline_knee, sp.policy_knee) == ("default", "round-robin", 4.0, 16.0)
    assert [r.load for r in sp.rows] == [1.0, 4.0, 16.0]
    at_knee = sp.at_baseline_knee()
    assert at_knee is not None and at_knee.marks == ("baseline knee",)
    assert at_knee.ratios["ttft_p90_s"] == pytest.approx(0.4)
    assert at_knee.ratios["goodput_rps"] == pytest.approx(1.6)
    assert at_knee.ratios["prefix_hit_rate"] == pytest.approx(3.5)
    assert [(str(t), met) for t, _, met in sp.verdicts()] == [
        ("ttft_p90_s <= 0.5x", True),
        ("goodput_rps >= 1.5x", True),
        ("prefix_hit_rate >= 2x", True),
    ]


def test_random_within_five_percent_of_least_loaded() -> None:
    comparisons = compare(RUNS)
    (rnd,) = [c for c in comparisons if c.workload == "random" and c.baseline == "least-loaded"]
    verdicts = {str(t): met for t, _, met in rnd.verdicts()}
    assert verdicts == {"goodput_rps >= 0.95x": True, "ttft_p90_s <= 1.05x": True}


def test_a_missed_target_and_an_unmeasured_ratio() -> None:
    runs = [
        _rec("round-robin", "shared-prefix", 1, 0.1, 1.0, 0.0),
        _rec("default", "shared-prefix", 1, 0.09, 1.0, 0.5),
    ]
    (c,) = compare(runs)
    verdicts = {str(t): (value, met) for t, value, met in c.verdicts()}
    value, met = verdicts["ttft_p90_s <= 0.5x"]
    assert value == pytest.approx(0.9) and met is False
    assert verdicts["prefix_hit_rate >= 2x"] == (None, None)  # round robin had no hits: no ratio
    text = comparisons_markdown([c])
    assert "MISSED" in text and "not measured" in text


def test_pairs_measured_while_the_simulator_fell_behind_are_flagged() -> None:
    runs = [{**r, "sim_distorted": r["policy"] == "default" and r["concurrency"] == 16} for r in RUNS]
    (sp,) = [c for c in compare(runs) if c.workload == "shared-prefix"]
    assert [r.marks for r in sp.rows] == [(), ("baseline knee",), ("policy knee", "⚠ simulator distorted")]


def test_pairs_missing_a_policy_are_skipped() -> None:
    assert compare([_rec("default", "random", 1, 0.1, 1.0, 0.0)]) == []


@pytest.mark.parametrize(("a", "b", "expected"), [(1.0, 2.0, 0.5), (None, 1.0, None), (1.0, 0.0, None)])
def test_ratio(a: float | None, b: float | None, expected: float | None) -> None:
    assert ratio(a, b) == expected


def test_target_bounds() -> None:
    assert Target("x", "<=", 0.5).met(0.5) and not Target("x", "<=", 0.5).met(0.51)
    assert Target("x", ">=", 2.0).met(2.0) and Target("x", ">=", 2.0).met(None) is None


def test_markdown_has_one_table_per_comparison() -> None:
    text = comparisons_markdown(compare(RUNS))
    assert text.startswith("## Comparisons")
    assert "### shared-prefix (closed loop): default vs round-robin" in text
    assert "| c=4 | 0.40x | 1.60x | 3.50x | 1.60x | baseline knee |" in text
