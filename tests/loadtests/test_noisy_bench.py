"""loadtests/noisy_bench.py: the gateway config it runs is valid, and the figures it reports from
traces (simulated TTFT percentiles over successful requests, statuses, served rate)."""

from __future__ import annotations

import pytest

from gateway.config import parse_config
from loadtests import noisy_bench
from loadtests.runner import LoadConfig, RunResult
from tests.loadtests.test_measures import trace


def result(traces: list, wall_s: float) -> RunResult:
    return RunResult(
        config=LoadConfig(rate=1.0),
        traces=traces,
        started=0.0,
        warmup_end=0.0,
        wall_s=wall_s,
        sent=len(traces),
        incomplete=0,
        loadgen=None,  # type: ignore[arg-type]  # not read by describe
        max_schedule_lag_s=0.0,
    )


def test_the_gateway_config_is_valid_and_protects_by_flow_control_alone() -> None:
    cfg = parse_config(noisy_bench.gateway_config(["http://127.0.0.1:1", "http://127.0.0.1:2"], slots=16))
    assert [t.name for t in cfg.tenants] == ["A", "B"]
    assert all(t.limits.rpm is None and t.limits.tpm is None for t in cfg.tenants)
    assert cfg.flow_control.enabled and cfg.flow_control.saturation.max_in_flight_per_replica == 16
    off = parse_config(noisy_bench.gateway_config(["http://127.0.0.1:1"], slots=16, flow_control=False))
    assert not off.flow_control.enabled
    none = parse_config(noisy_bench.gateway_config(["http://127.0.0.1:1"], slots=16, reserve=0))
    assert none.flow_control.fair_share.reserve_per_replica == 0
    assert cfg.flow_control.fair_share == type(cfg.flow_control.fair_share)()  # kvgate's default


def test_describe_reports_simulated_ttfts_of_successful_requests_only() -> None:
    scale = noisy_bench.TIME_SCALE
    traces = [trace(f"ok{i}", start=0.0, chunks=(scale * (i + 1) / 10,)) for i in range(10)]
    traces += [trace("shed", status=503, error="http: 503"), trace("busy", status=429, error="http: 429")]
    d = noisy_bench.describe(result(traces, wall_s=2 * scale))
    assert d["requests"] == 12 and d["statuses"] == {200: 10, 503: 1, 429: 1}
    assert d["ttft_p50_s"] == pytest.approx(0.55)  # 0.1 .. 1.0 simulated seconds
    assert d["ttft_p95_s"] == pytest.approx(0.955)
    assert d["ok_per_s"] == pytest.approx(5.0)  # 10 served in 2 simulated seconds


def test_describe_without_a_success_has_no_percentiles() -> None:
    d = noisy_bench.describe(result([trace("x", status=503, error="http: 503")], wall_s=1.0))
    assert d["ttft_p95_s"] is None and d["ok_per_s"] == 0.0


def test_engine_means_over_the_requests_finished_between_two_scrapes() -> None:
    before = {
        "vllm:time_to_first_token_seconds_sum": 1.0,
        "vllm:time_to_first_token_seconds_count": 10.0,
        "vllm:request_queue_time_seconds_sum": 0.5,
        "vllm:request_queue_time_seconds_count": 10.0,
    }
    after = {
        **before,
        "vllm:time_to_first_token_seconds_sum": 5.0,
        "vllm:time_to_first_token_seconds_count": 20.0,
    }
    means = noisy_bench.engine_means(before, after)
    assert means["time_to_first_token_mean_s"] == pytest.approx(0.4)  # 4 s over 10 new requests
    assert means["request_queue_time_mean_s"] is None  # nothing new finished


def test_queue_share_over_the_admissions_between_two_reads() -> None:
    before = {"direct": 10.0, "queued": 0.0, "wait_sum": 0.0, "wait_count": 0.0}
    after = {"direct": 12.0, "queued": 6.0, "wait_sum": 3.0 * noisy_bench.TIME_SCALE, "wait_count": 6.0}
    q = noisy_bench.queue_share(before, after)
    assert q["queued_share"] == pytest.approx(0.75)  # 6 of the 8 new admissions waited
    assert q["queue_wait_mean_s"] == pytest.approx(0.5)  # 3 simulated seconds over 6
    assert noisy_bench.queue_share(before, before) == {"queued_share": None, "queue_wait_mean_s": None}


def test_the_latency_gate_settings_reach_the_gateway_config() -> None:
    on = parse_config(noisy_bench.gateway_config(["http://127.0.0.1:1"], 16, predicted=True, knee_factor=1.5))
    assert on.flow_control.predicted_admission and on.flow_control.knee_factor == 1.5
    prior = on.models[0].latency_prior
    assert prior is not None and prior.profile == "llama-3-8b-h100"
    off = parse_config(noisy_bench.gateway_config(["http://127.0.0.1:1"], 16, predicted=False))
    assert not off.flow_control.predicted_admission


def test_the_light_knee_and_the_profile_without_the_knee_filter() -> None:
    urls = ["http://127.0.0.1:1"]
    cfg = parse_config(noisy_bench.gateway_config(urls, slots=16, light_knee_factor=100.0))
    assert cfg.flow_control.light_knee_factor == 100.0 and not cfg.scheduling.profiles
    old = parse_config(
        noisy_bench.gateway_config(urls, slots=16, profile="predicted-latency", knee_filter=False)
    )
    assert old.scheduling.profile == "predicted-latency"
    filters = old.scheduling.profiles["predicted-latency"].model_dump()["filters"]
    assert "latency-knee" not in [f["type"] for f in filters] and "fresh" in [f["type"] for f in filters]


def test_b_traces_count_the_first_tokens_of_a_that_came_while_b_waited() -> None:
    from dataclasses import replace

    scale = noisy_bench.TIME_SCALE
    b = [
        replace(trace("b0", start=0.0, chunks=(0.2 * scale,)), replica="r0"),  # waited beside a0
        replace(trace("b1", start=1.0 * scale, chunks=(1.05 * scale,)), replica="r1"),
    ]
    a = [
        replace(trace("a0", start=-5.0, chunks=(0.1 * scale,)), replica="r0"),  # first token while b0 waited
        replace(trace("a1", start=-5.0, chunks=(0.15 * scale,)), replica="r1"),  # on the other replica
        replace(trace("a2", start=-5.0, chunks=(0.5 * scale,)), replica="r1"),  # after b0's, before b1
    ]
    rows = noisy_bench.b_traces(result(b, 1.0), result(a, 1.0))
    assert [
        (r["replica"], r["a_first_tokens_same_replica"], r["a_first_tokens_other_replicas"]) for r in rows
    ] == [
        ("r0", 1, 1),
        ("r1", 0, 0),
    ]
    assert rows[1]["sent_s"] == pytest.approx(1.0) and rows[0]["ttft_s"] == pytest.approx(0.2)
    summary = noisy_bench.trace_summary(rows)
    assert summary["a_prefill_same_replica"]["n"] == 1
    assert summary["no_a_prefill_same_replica"]["ttft_p50_ms"] == pytest.approx(50.0)
