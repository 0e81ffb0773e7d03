"""Measures on hand-made traces: every expected number below is worked out by hand from the trace."""

from __future__ import annotations

import pytest

from loadtests.measures import (
    LatencyStats,
    LoadgenUsage,
    ReplicaCounters,
    RequestTrace,
    fleet_delta,
    meets_slo,
    parse_replica_counters,
    percentile,
    prefix_hit_rate,
    summarize,
)
from loadtests.slo import Slo
from tests.vllm_fixtures import VLLM_FIXTURES

FIXTURES = str(VLLM_FIXTURES)


def trace(
    rid: str = "r",
    *,
    start: float = 0.0,
    chunks: tuple[float, ...] = (),
    end: float | None = None,
    tokens: int | None = None,
    status: int = 200,
    error: str | None = None,
    tenant: str | None = None,
    prompt: int | None = None,
    cached: int | None = None,
) -> RequestTrace:
    return RequestTrace(
        request_id=rid,
        tenant=tenant,
        group=None,
        start=start,
        first_token=chunks[0] if chunks else None,
        end=end if end is not None else (chunks[-1] if chunks else start),
        chunk_times=list(chunks),
        output_tokens=tokens if tokens is not None else len(chunks),
        prompt_tokens=prompt,
        cached_tokens=cached,
        status=status,
        error=error,
    )


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([5.0], 50, 5.0),
        ([5.0], 99, 5.0),
        ([1.0, 2.0], 50, 1.5),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([1.0, 2.0, 3.0, 4.0], 90, 3.7),  # rank 0.9 x 3 = 2.7
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([float(i) for i in range(1, 101)], 99, 99.01),  # rank 98.01
        ([0.0, 10.0], 25, 2.5),
    ],
)
def test_percentile_linear_interpolation(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_rejects_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_latency_stats_of_nothing_is_none() -> None:
    assert LatencyStats.of([]) == LatencyStats(0, None, None, None, None, None)


def test_per_request_ttft_tpot_itl_e2e() -> None:
    # sent at 10.0; content at 10.5, 10.6, 10.8, 11.1; stream ends 11.2; 4 tokens.
    t = trace(start=10.0, chunks=(10.5, 10.6, 10.8, 11.1), end=11.2)
    assert t.ttft == pytest.approx(0.5)
    assert t.e2e == pytest.approx(1.2)
    assert t.tpot == pytest.approx((1.2 - 0.5) / 3)  # the first token is excluded
    assert t.itls() == pytest.approx([0.1, 0.2, 0.3])


def test_tpot_uses_usage_tokens_not_chunks() -> None:
    # Two chunks carrying 8 tokens between them (usage says 8).
    t = trace(start=0.0, chunks=(1.0, 2.0), end=2.4, tokens=8)
    assert t.tpot == pytest.approx(1.4 / 7)


@pytest.mark.parametrize("tokens", [0, 1])
def test_no_tpot_with_at_most_one_token(tokens: int) -> None:
    assert trace(chunks=(1.0,), end=1.0, tokens=tokens).tpot is None


def test_summary_over_a_small_run() -> None:
    traces = [
        trace("a", start=0.0, chunks=(1.0, 1.5, 2.0), end=2.0),  # ttft 1, tpot 0.5, e2e 2
        trace("b", start=1.0, chunks=(1.2, 1.4, 1.6, 1.8, 2.0), end=2.0),  # ttft 0.2, tpot 0.2, e2e 1
        trace("c", start=2.0, chunks=(4.0,), end=4.0),  # ttft 2, no tpot, e2e 2
        trace("d", start=3.0, end=3.1, status=429, error="http: 429 slow down"),
        trace("e", start=3.0, chunks=(3.5,), end=5.0, error="connection: reset"),
    ]
    m = summarize(traces, warmup_end=0.0)
    assert m.requests == 5 and m.completed == 3 and m.errors == 2
    assert m.status_429 == 1 and m.status_503 == 0
    assert m.error_kinds == {"connection": 1, "http": 1}
    assert m.duration_s == pytest.approx(5.0)  # warm-up end 0 to the last end 5.0
    assert m.ttft.count == 3 and m.ttft.p50 == pytest.approx(1.0)
    assert m.ttft.p90 == pytest.approx(1.8)  # [0.2, 1, 2], rank 1.8
    assert m.tpot.count == 2 and m.tpot.p50 == pytest.approx(0.35)
    assert m.itl.count == 6 and m.itl.p50 == pytest.approx(0.2)  # 0.5 0.5 0.2 0.2 0.2 0.2
    assert m.e2e.p99 == pytest.approx(2.0)
    assert m.output_tokens == 9  # failed requests' tokens do not count
    assert m.output_tok_s == pytest.approx(9 / 5.0)
    assert m.requests_s == pytest.approx(3 / 5.0)
    assert m.goodput_rps == m.requests_s and m.goodput_tok_s == m.output_tok_s  # no SLO: all good


def test_goodput_counts_only_requests_meeting_every_threshold() -> None:
    traces = [
        trace("fast", start=0.0, chunks=(0.1, 0.2, 0.3), end=0.3),  # ttft .1 tpot .1
        trace("slow-first", start=0.0, chunks=(2.0, 2.1), end=2.1),  # ttft 2
        trace("slow-decode", start=0.0, chunks=(0.1, 1.1, 2.1), end=2.1),  # tpot 1
        trace("one-token", start=0.0, chunks=(0.5,), end=0.5),  # no tpot: judged on ttft
        trace("failed", start=0.0, chunks=(0.1,), end=0.2, error="stream-error: x"),
    ]
    slo = Slo(ttft_s=1.0, tpot_s=0.5)
    assert [meets_slo(t, slo) for t in traces] == [True, False, False, True, False]
    m = summarize(traces, warmup_end=0.0, slo=slo)
    assert m.duration_s == pytest.approx(2.1)
    assert m.goodput_rps == pytest.approx(2 / 2.1)
    assert m.goodput_tok_s == pytest.approx(4 / 2.1)  # 3 + 1 tokens


@pytest.mark.parametrize(
    ("slo", "expected"),
    [
        (Slo(e2e_s=1.0), False),  # e2e 1.3
        (Slo(e2e_s=1.3), True),
        (Slo(itl_s=0.5), False),  # the largest gap is 0.6
        (Slo(itl_s=0.61), True),
        (Slo(ttft_s=0.2, tpot_s=0.4, e2e_s=2.0, itl_s=1.0), True),  # ttft .2 tpot (1.1)/3
    ],
)
def test_e2e_and_itl_thresholds(slo: Slo, expected: bool) -> None:
    t = trace(start=0.0, chunks=(0.2, 0.3, 0.9, 1.3), end=1.3)
    assert meets_slo(t, slo) is expected


def test_warmup_requests_are_dropped() -> None:
    traces = [
        trace("warm", start=0.5, chunks=(1.0,), end=1.0, status=503, error="http: 503"),
        trace("cold", start=1.0, chunks=(1.5, 2.0), end=3.0),
    ]
    m = summarize(traces, warmup_end=1.0)
    assert m.requests == 1 and m.errors == 0 and m.status_503 == 0
    assert m.duration_s == pytest.approx(2.0)
    assert m.ttft.p50 == pytest.approx(0.5)


def test_no_measured_requests() -> None:
    m = summarize([trace(start=0.0, chunks=(1.0,))], warmup_end=5.0)
    assert m.requests == 0 and m.duration_s == 0 and m.output_tok_s == 0 and m.ttft.p90 is None


def test_per_tenant_breakdown() -> None:
    traces = [
        trace("n1", tenant="noisy", start=0.0, chunks=(0.1, 0.2, 0.3), end=0.3),
        trace("n2", tenant="noisy", start=0.0, chunks=(0.5, 0.6, 0.7), end=0.7),
        trace("n3", tenant="noisy", start=0.0, end=0.1, status=429, error="http: 429"),
        trace("q1", tenant="quiet", start=0.0, chunks=(0.2, 1.0), end=1.0),
    ]
    m = summarize(traces, warmup_end=0.0, slo=Slo(ttft_s=0.4))
    assert sorted(m.per_tenant) == ["noisy", "quiet"]
    noisy, quiet = m.per_tenant["noisy"], m.per_tenant["quiet"]
    assert (noisy.requests, noisy.completed, noisy.errors, noisy.status_429) == (3, 2, 1, 1)
    assert noisy.offered_share == pytest.approx(0.75) and quiet.offered_share == pytest.approx(0.25)
    assert noisy.served_share == pytest.approx(6 / 8) and quiet.served_share == pytest.approx(2 / 8)
    assert noisy.output_tok_s == pytest.approx(6 / 1.0)
    assert noisy.goodput_rps == pytest.approx(1.0) and quiet.goodput_rps == pytest.approx(1.0)
    assert noisy.ttft.p50 == pytest.approx(0.3) and quiet.ttft.p95 == pytest.approx(0.2)
    assert set(noisy.as_dict()) >= {"ttft_p95_s", "served_share", "offered_share", "status_429"}


def test_no_tenants_no_breakdown() -> None:
    assert summarize([trace(chunks=(1.0,))], warmup_end=0.0).per_tenant == {}


def test_cached_token_fraction_from_usage() -> None:
    traces = [
        trace("a", chunks=(1.0,), prompt=100, cached=80),
        trace("b", chunks=(1.0,), prompt=300, cached=0),
        trace("c", chunks=(1.0,), prompt=100),  # no cached figure: left out
    ]
    assert summarize(traces, warmup_end=0.0).cached_token_fraction == pytest.approx(80 / 400)
    assert summarize(traces[2:], warmup_end=0.0).cached_token_fraction is None


def test_loadgen_usage() -> None:
    u = LoadgenUsage(cpu_s=4.5, wall_s=5.0, requests=900)
    assert u.cpu_frac == pytest.approx(0.9) and u.bottleneck
    assert u.cpu_ms_per_request == pytest.approx(5.0)
    assert not LoadgenUsage(cpu_s=1.0, wall_s=5.0, requests=10).bottleneck
    assert LoadgenUsage(cpu_s=0.0, wall_s=0.0, requests=0).cpu_frac == 0.0


def test_parse_real_vllm_metrics() -> None:
    with open(f"{FIXTURES}/metrics.txt", encoding="utf-8") as f:
        c = parse_replica_counters(f.read())
    assert c == ReplicaCounters(prefix_queries=10128.0, prefix_hits=128.0, preemptions=0.0)


def test_parse_sums_engines_and_reads_old_names() -> None:
    text = "\n".join(
        [
            "# HELP vllm:prefix_cache_hits_total x",
            'vllm:prefix_cache_queries_total{engine="0",model_name="a b"} 100.0',
            'vllm:prefix_cache_queries_total{engine="1",model_name="a b"} 50.0',
            'vllm:prefix_cache_queries_created{engine="0"} 1.7e9',
            'vllm:prefix_cache_hits_total{engine="0",model_name="a b"} 30.0 1700000000000',
            "vllm:num_preemptions_total 4",
        ]
    )
    assert parse_replica_counters(text) == ReplicaCounters(150.0, 30.0, 4.0)
    old = 'vllm:gpu_prefix_cache_queries_total{m="x"} 10\nvllm:gpu_prefix_cache_hits_total{m="x"} 5\n'
    assert parse_replica_counters(old) == ReplicaCounters(10.0, 5.0, 0.0)
    assert parse_replica_counters("") == ReplicaCounters(0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("before", "after", "rate", "preemptions"),
    [
        ({"r0": (100, 10, 0), "r1": (100, 50, 1)}, {"r0": (300, 110, 0), "r1": (200, 50, 3)}, 100 / 300, 2),
        ({}, {"r0": (100, 25, 0)}, 0.25, 0),  # a replica new in `after` counts from zero
        ({"r0": (500, 400, 9)}, {"r0": (100, 50, 1)}, 0.5, 1),  # restarted: counters reset
        ({"r0": (100, 10, 0), "gone": (1, 1, 0)}, {"r0": (100, 10, 0)}, None, 0),  # no new queries
    ],
)
def test_fleet_delta_and_hit_rate(
    before: dict[str, tuple[float, float, float]],
    after: dict[str, tuple[float, float, float]],
    rate: float | None,
    preemptions: float,
) -> None:
    b = {k: ReplicaCounters(*v) for k, v in before.items()}
    a = {k: ReplicaCounters(*v) for k, v in after.items()}
    assert prefix_hit_rate(b, a) == (pytest.approx(rate) if rate is not None else None)
    assert fleet_delta(b, a).preemptions == preemptions
