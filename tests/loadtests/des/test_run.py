from __future__ import annotations

from dataclasses import replace

import pytest

from loadtests.des import DesConfig, FleetSpec, run_des
from loadtests.results import validate_record
from loadtests.runner import LoadConfig
from loadtests.slo import Slo
from loadtests.workloads import SharedPrefixWorkload

INF = float("inf")
FLEET = FleetSpec(replicas=3, profile="tiny")


def workload() -> SharedPrefixWorkload:
    return SharedPrefixWorkload(groups=6, prompts_per_group=8, system_prompt_tokens=256, question_tokens=24,
                                output_tokens=12, model=FLEET.model_name, seed=5)


def test_the_record_is_a_valid_results_record_with_the_runs_own_figures() -> None:
    result = run_des(workload().requests(), DesConfig(FLEET, policy="least-loaded"),
                     LoadConfig(concurrency=6, duration_s=INF, warmup_s=0.01))
    record = result.to_record(workload="shared-prefix", slo=Slo(ttft_s=0.05))
    validate_record(record)
    assert record["policy"] == "least-loaded" and record["mode"] == "closed" and record["concurrency"] == 6
    assert record["driver"] == "des" and record["loadgen_cpu_frac"] == 0.0
    assert record["requests"] == sum(t.start >= 0.01 for t in result.traces) < 48
    assert record["prefix_hit_rate"] == result.fleet.prefix_hit_rate and 0 < record["prefix_hit_rate"] < 1
    des = record["des"]
    assert des["replicas"] == 3 and des["requests_sent"] == 48 and des["events"] == result.events
    assert [r["name"] for r in des["per_replica"]] == ["r0", "r1", "r2"]
    assert sum(r["requests"] for r in des["per_replica"]) == 48
    rates = [r["prefix_hit_rate"] for r in des["per_replica"] if r["prefix_hit_rate"] is not None]
    assert des["replica_hit_rate_min"] == min(rates) and des["replica_hit_rate_max"] == max(rates)


def test_without_chunk_times_every_measure_is_the_same_and_itl_within_a_microsecond() -> None:
    load = LoadConfig(concurrency=6, duration_s=INF)
    full = run_des(workload().requests(), DesConfig(FLEET, record_chunks=True), load)
    compact = run_des(workload().requests(), DesConfig(FLEET, record_chunks=False), load)
    assert all(t.chunk_times == [] for t in compact.traces) and full.itl is None
    a, b = full.summarize(), compact.summarize()
    assert replace(a, itl=b.itl) == b
    assert a.itl.count == b.itl.count > 0
    for name in ("mean", "p50", "p90", "p95", "p99"):
        assert getattr(b.itl, name) == pytest.approx(getattr(a.itl, name), abs=1e-6)
    with pytest.raises(ValueError, match="ITL SLO"):
        compact.summarize(Slo(itl_s=0.1))
