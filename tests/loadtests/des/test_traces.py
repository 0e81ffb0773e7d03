from __future__ import annotations

import random

import pytest

from loadtests.des.traces import ItlHistogram, OpenRequest
from loadtests.measures import LatencyStats
from loadtests.workloads.spec import RequestSpec


@pytest.mark.parametrize("seed", range(5))
def test_histogram_percentiles_equal_the_measures_on_the_expanded_values(seed: int) -> None:
    rng = random.Random(seed)
    # Whole microseconds, with repeats (a step's gap is shared by its batch) and a few outliers.
    values_us = [rng.choice([7_000, 7_250, 9_900, 12_000, 450_000]) for _ in range(rng.randint(1, 300))]
    hist = ItlHistogram()
    for v in values_us:
        hist.add(v / 1e6)
    expected = LatencyStats.of(v / 1e6 for v in values_us)
    got = hist.stats()
    assert got.count == expected.count == len(hist)
    for name in ("mean", "p50", "p90", "p95", "p99"):
        assert getattr(got, name) == pytest.approx(getattr(expected, name), abs=1e-9), name


def test_weighted_adds_and_rounding_to_a_microsecond() -> None:
    hist = ItlHistogram()
    hist.add(0.0100004, n=3)  # rounds to 10,000 µs
    hist.add(0.0200006)  # rounds to 20,001 µs
    assert hist.counts == {10_000: 3, 20_001: 1}
    stats = hist.stats()
    assert stats.p50 == pytest.approx(0.010) and stats.p99 == pytest.approx(0.010 + 0.97 * 0.010001)


def test_an_empty_histogram_has_no_figures() -> None:
    assert ItlHistogram().stats() == LatencyStats(0, None, None, None, None, None)


def test_an_open_request_becomes_the_live_runners_trace() -> None:
    spec = RequestSpec(request_id="sp-1-2", endpoint="chat", body={}, tenant="t", group="g1")
    o = OpenRequest(spec, start=1.0, engine_id="7", record_chunks=True)
    o.prompt_tokens = 100
    o.first = 1.25
    assert o.chunks is not None
    o.chunks += [1.25, 1.5, 1.75]
    trace = o.trace(1.75, output_tokens=3, cached_tokens=64, replica_name="r3")
    assert (trace.request_id, trace.tenant, trace.group, trace.replica) == ("sp-1-2", "t", "g1", "r3")
    assert trace.ok and trace.ttft == 0.25 and trace.tpot == 0.25 and trace.itls() == [0.25, 0.25]
    assert (trace.prompt_tokens, trace.cached_tokens) == (100, 64)
    failed = OpenRequest(spec, 2.0, "8", record_chunks=False).trace(
        2.0, output_tokens=0, cached_tokens=None, status=404, error="http: 404 no such model"
    )
    assert not failed.ok and failed.chunk_times == [] and failed.prompt_tokens is None
