"""Merging several workers' metrics into one /metrics answer (gateway/worker_metrics.py), and the
settings that go with several workers: memory:// refused, the limits' share, restart-only."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families

from gateway import worker_metrics as wm
from gateway.config import ConfigError, parse_config
from gateway.reload_scope import restart_needed
from gateway.tenants import TenantRegistry


def worker(requests: float, in_flight: float, healthy: float, latencies: list[float]) -> list[wm.Family]:
    r = CollectorRegistry()
    Counter("kvgate_requests", "Requests.", ["status"], registry=r).labels("200").inc(requests)
    Gauge("kvgate_requests_in_flight", "In flight.", registry=r).set(in_flight)
    Gauge("kvgate_replica_healthy", "Healthy.", ["replica"], registry=r).labels("r0").set(healthy)
    h = Histogram("kvgate_ttft_seconds", "TTFT.", buckets=(0.1, 1.0), registry=r)
    for v in latencies:
        h.observe(v)
    return wm.local_families(r)


def samples(families: list[wm.Family]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = wm.render(families).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if not s.name.endswith("_created")
    }


def test_counters_and_histograms_sum_gauges_follow_their_rule() -> None:
    a = worker(3, in_flight=2, healthy=1, latencies=[0.05, 0.5])
    b = worker(4, in_flight=5, healthy=0, latencies=[2.0])
    got = samples(wm.merge([a, b]))
    assert got[("kvgate_requests_total", (("status", "200"),))] == 7
    assert got[("kvgate_requests_in_flight", ())] == 7  # summed
    assert got[("kvgate_replica_healthy", (("replica", "r0"),))] == 0  # min: ejected by one worker
    assert got[("kvgate_ttft_seconds_bucket", (("le", "0.1"),))] == 1
    assert got[("kvgate_ttft_seconds_bucket", (("le", "1.0"),))] == 2
    assert got[("kvgate_ttft_seconds_bucket", (("le", "+Inf"),))] == 3
    assert got[("kvgate_ttft_seconds_count", ())] == 3
    assert got[("kvgate_ttft_seconds_sum", ())] == pytest.approx(2.55)


def test_an_exited_worker_keeps_its_counters_and_loses_its_gauges() -> None:
    live = worker(3, in_flight=2, healthy=1, latencies=[0.05])
    gone = worker(10, in_flight=9, healthy=0, latencies=[0.5, 0.5])
    got = samples(wm.merge([live], exited=[gone]))
    assert got[("kvgate_requests_total", (("status", "200"),))] == 13
    assert got[("kvgate_ttft_seconds_count", ())] == 3
    assert got[("kvgate_requests_in_flight", ())] == 2
    assert got[("kvgate_replica_healthy", (("replica", "r0"),))] == 1


def test_a_worker_snapshot_survives_the_round_trip_with_infinities() -> None:
    fams = [["g", "gauge", "A gauge.", [["g", {"k": "v"}, float("inf")], ["g", {"k": "w"}, -1.0]]]]
    pid, back = wm.loads(wm.dumps(fams, 42))
    assert pid == 42 and back == fams


def redis_config(**server: object) -> dict[str, object]:
    return {
        "server": server,
        "state": {"store": "redis://127.0.0.1:6379/0", "gateways": 3},
        "tenants": [{"name": "t", "limits": {"max_concurrency": 12}}],
    }


def test_in_memory_limits_are_refused_with_several_workers() -> None:
    with pytest.raises(
        ConfigError, match=r"server.workers: 2 .*memory://.*multiplying every tenant's limits by 2"
    ):
        parse_config({"server": {"workers": 2}})
    parse_config({"server": {"workers": 1}})


def test_each_process_enforces_its_share_of_gateways_times_workers() -> None:
    config = parse_config(redis_config(workers=2))
    assert config.limit_processes == 6
    tenant = TenantRegistry(config).tenants[0]
    assert tenant.max_concurrency == 2  # ceil(12 / (3 gateways x 2 workers))
    assert TenantRegistry(parse_config(redis_config())).tenants[0].max_concurrency == 4


def test_the_worker_count_needs_a_restart() -> None:
    old, new = parse_config(redis_config(workers=2)), parse_config(redis_config(workers=4))
    assert [p.split(" ")[0] for p in restart_needed(old, new)] == ["server.workers"]


def test_goodput_headroom_takes_the_most_loaded_workers_view() -> None:
    # Each worker computes the pool's headroom from the same replicas: summing would count the
    # pool's capacity once per worker; the lowest is the worker that sees the most load.
    def view(rps: float) -> list[wm.Family]:
        r = CollectorRegistry()
        Gauge("kvgate_pool_goodput_headroom_requests_per_second", "H.", ["pool"], registry=r).labels("m").set(
            rps
        )
        g = Gauge("kvgate_pool_goodput_headroom_tokens_per_second", "T.", ["pool", "kind"], registry=r)
        g.labels("m", "prompt").set(rps * 1000)
        g.labels("m", "output").set(rps * 200)
        Gauge("kvgate_pool_goodput_headroom_ratio", "R.", ["pool"], registry=r).labels("m").set(rps / 20)
        return wm.local_families(r)

    got = samples(wm.merge([view(12.0), view(-3.0), view(8.0)]))
    assert got[("kvgate_pool_goodput_headroom_requests_per_second", (("pool", "m"),))] == -3.0
    assert (
        got[("kvgate_pool_goodput_headroom_tokens_per_second", (("kind", "prompt"), ("pool", "m")))]
        == -3000.0
    )
    assert (
        got[("kvgate_pool_goodput_headroom_tokens_per_second", (("kind", "output"), ("pool", "m")))] == -600.0
    )
    # Gone with an exited worker (gauges are dropped).
    assert ("kvgate_pool_goodput_headroom_requests_per_second", (("pool", "m"),)) not in samples(
        wm.merge([], exited=[view(1.0)])
    )
