"""loadtests/gateways_bench.py and its report: group placement, index modes and the summary's ratios
from hand-made data; then one real cell (a simulated fleet publishing KV events, `kvgate serve
--workers 2` on the exact index, limits in a real Redis), checking the record and that its hit rate
is the replicas' own counters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loadtests import gateways_bench
from loadtests.gateways_report import group_placement, index_modes, summary_markdown
from loadtests.measures import RequestTrace
from loadtests.redis_process import RedisServer
from tests.gateway.redis_server import redis_server  # noqa: F401  (the fixture: a private Redis)


def trace(group: str, start: float, replica: str) -> RequestTrace:
    return RequestTrace(f"{group}-{start}", None, group, start, start + 0.1, start + 1, [start + 0.1],
                        4, 10, 0, 200, None, replica)  # fmt: skip


def test_group_placement_counts_distinct_replicas_and_moves_in_send_order() -> None:
    traces = [trace("a", 3, "r1"), trace("a", 1, "r0"), trace("a", 2, "r0"), trace("a", 4, "r0"),
              trace("b", 1, "r2"), trace("b", 2, "r2")]  # fmt: skip
    p = group_placement(traces)
    assert (p.groups, p.moves, p.replicas_mean) == (2, 2, 1.5)  # a: r0 r0 r1 r0; b stays


def test_index_modes_reads_the_mode_whose_sample_is_one() -> None:
    text = (
        '# TYPE kvgate_prefix_index_mode gauge\n'
        'kvgate_prefix_index_mode{replica="r0",mode="exact"} 1.0\n'
        'kvgate_prefix_index_mode{replica="r0",mode="approximate"} 0.0\n'
        'kvgate_prefix_index_mode{replica="r1",mode="exact"} 0.0\n'
        'kvgate_prefix_index_mode{replica="r1",mode="approximate"} 1.0\n'
    )  # fmt: skip
    assert index_modes(text) == {"r0": "exact", "r1": "approximate"}


def _record(index: str, n: int, seed: int, hit: float, goodput: float, jump: float = 0.0) -> dict[str, Any]:
    return {"workload": "w", "index": index, "gateways": n, "seed": seed, "prefix_hit_rate": hit,
            "goodput_rps": goodput, "ttft_p90_s": 0.1, "group_moves": 0, "errors": 0, "incomplete": 0,
            "gateway_cpu_frac": 0.1, "sim_cpu_frac": 0.1, "loadgen_cpu_frac": 0.1, "sim_step_lag_p99_s": 0.01,
            "sim_clock_jump_s": jump, "duration_s": 10.0, "exact_replicas_before": 2,
            "exact_replicas_after": 2, "loadavg_end": 1.0}  # fmt: skip


def test_the_summary_divides_each_seed_by_the_same_seeds_one_gateway_figure() -> None:
    """And flags the seeds whose simulator fell behind (clock jumps > 2% of 2 replicas x 10 s)."""
    records = [_record("exact", 1, 0, 0.8, 10.0), _record("exact", 1, 1, 0.5, 10.0),
               _record("exact", 4, 0, 0.4, 10.0, jump=0.3),
               _record("exact", 4, 1, 0.5, 5.0, jump=0.5)]  # fmt: skip
    text = summary_markdown(records, replicas=2)
    row = next(line for line in text.splitlines() if line.startswith("| exact | 4 |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    # hit rate: median 45% (worst 40%); ratios per seed 0.5 and 1.0: median 0.75, worst 0.50
    assert cells[3] == "45.0% (40.0%)"
    assert cells[6] == "0.750 (0.500)" and cells[7] == "0.750 (0.500)"
    assert cells[-1] == "1"  # seed 1: 0.5 s of jumps > 0.4 s; seed 0: 0.3 s is not
    one = next(line for line in text.splitlines() if line.startswith("| exact | 1 |"))
    assert one.rstrip(" |").endswith("-")


@pytest.mark.timeout(180)
def test_one_live_cell_writes_a_record_whose_hit_rate_is_the_replicas_counters(
    tmp_path: Path,
    redis_server: RedisServer,  # noqa: F811
) -> None:
    out = tmp_path / "run"
    argv = ["--out", str(out), "--workloads", "shared-prefix", "--gateways", "2", "--indexes", "exact",
            "--seeds", "0", "--replicas", "2", "--time-scale", "1", "--concurrency", "4", "--requests", "16",
            "--warmup-requests", "4", "--no-pin", "--redis-url", redis_server.url]  # fmt: skip
    assert gateways_bench.main(argv) == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 1
    r = records[0]
    assert (r["workload"], r["index"], r["gateways"], r["seed"]) == ("shared-prefix", "exact", 2, 0)
    assert r["errors"] == 0 and r["incomplete"] == 0 and r["requests"] == 16
    assert r["exact_replicas_before"] == 2 and r["exact_replicas_after"] == 2 and r["primed_failed"] == 0
    # the replicas' own counters: every measured prompt (>= 1,024 tokens) was queried, and the hit
    # rate is their ratio, not the clients' usage figures
    assert r["fleet_prefix_queries"] >= 1024 * r["completed"]
    assert r["fleet_prefix_hits"] > 0
    assert r["prefix_hit_rate"] == pytest.approx(r["fleet_prefix_hits"] / r["fleet_prefix_queries"])
    assert r["groups"] >= 1 and r["group_replicas_mean"] >= 1.0
    assert r["gateway_cpu_frac"] > 0  # the supervisor and its workers were measured
    summary = (out / "summary.md").read_text()
    assert "| exact | 2 | 1 |" in summary
    meta = json.loads((out / "meta.json").read_text())
    assert meta["fleet"]["replicas"] == 2 and meta["command"].startswith("python -m loadtests.gateways_bench")
