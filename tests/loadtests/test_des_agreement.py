from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.config import parse_config
from loadtests.des_agreement import Case, Side, compare, main, table
from loadtests.measures import LatencyStats

pytestmark = pytest.mark.timeout(180)


def side(ttft_p50: float, hit_rate: float | None) -> Side:
    stats = LatencyStats(10, ttft_p50, ttft_p50, ttft_p50, ttft_p50, ttft_p50)
    return Side(stats, stats, stats, hit_rate, 10, 0, {})


def test_the_case_is_the_bench_quick_fleet_and_its_gateway_config_loads() -> None:
    case = Case()
    work = case.workload()
    assert work.size() >= case.requests and work.sizing is not None
    assert 3.0 <= work.sizing.multiple_of_replica <= 6.0
    config = parse_config({**case.gateway_config("round-robin"),
                           "replicas": [{"url": "http://127.0.0.1:1", "model": "llama-3-8b"}]})
    assert config.scheduling.profile == "round-robin" and not config.flow_control.enabled


def test_compare_flags_differences_beyond_the_tolerance() -> None:
    rows = compare(side(0.100, 0.50), side(0.110, 0.60), tolerance=0.15)
    by_label = {r[0]: r for r in rows}
    assert by_label["TTFT p50 (s)"][3] == pytest.approx(0.10) and by_label["TTFT p50 (s)"][4]
    assert by_label["prefix hit rate"][3] == pytest.approx(0.20) and not by_label["prefix hit rate"][4]
    same = {r[0]: r for r in compare(side(0.1, 0.0), side(0.1, 0.0), tolerance=0.15)}
    assert same["prefix hit rate"][3] == 0.0 and same["prefix hit rate"][4]
    text = table("p", rows, side(0.1, 0.5), side(0.1, 0.6))
    assert "| prefix hit rate | 0.5000 | 0.6000 | +20.0% | OFF |" in text


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_a_tiny_live_run_and_its_simulation_agree(tmp_path: Path) -> None:
    affinity = os.sched_getaffinity(0)
    code = main(["--replicas", "4", "--profile", "tiny", "--kv-blocks", "256", "--time-scale", "1",
                 "--system-prompt-tokens", "256", "--question-tokens", "16", "--output-tokens", "4",
                 "--requests", "24", "--concurrency", "4", "--policies", "default",
                 "--json", str(tmp_path / "agree.json"), "--workdir", str(tmp_path / "work"),
                 "--tolerance", "1.0"])
    assert os.sched_getaffinity(0) == affinity  # the run's pinning was undone
    assert code == 0
    report = (tmp_path / "agree.json").read_text()
    assert '"prefix hit rate"' in report
