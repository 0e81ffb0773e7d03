"""Fleet operations of the bench: parsing the gauges and the simulator's own counters, and the idle
wait and prefix-cache reset against real simulated replicas over loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from loadtests import bench_fleet
from loadtests.bench_fleet import (
    ReplicaLoad,
    SimHealth,
    parse_gateway_gauges,
    parse_replica_load,
    parse_sim_health,
    sim_health_delta,
)
from loadtests.runner import LoadConfig, run_load
from loadtests.workloads import RandomWorkload
from simulator.fleet import SimFleet

MODEL = "tiny-llama"

REPLICA_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 2.0
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.25
kvgate_sim_step_lag_seconds_bucket{engine="0",le="0.001"} 90.0
kvgate_sim_step_lag_seconds_bucket{engine="0",le="0.01"} 99.0
kvgate_sim_step_lag_seconds_bucket{engine="0",le="+Inf"} 100.0
kvgate_sim_step_lag_seconds_count{engine="0"} 100.0
kvgate_sim_step_lag_seconds_sum{engine="0"} 0.2
kvgate_sim_clock_jump_seconds_total{engine="0"} 0.5
"""


def test_replica_load_sums_the_gauges() -> None:
    load = parse_replica_load(REPLICA_METRICS)
    assert load == ReplicaLoad(running=2.0, waiting=1.0, kv_usage=0.25) and not load.idle
    assert parse_replica_load("").idle


def test_sim_health_reads_the_lag_histogram_and_clock_jumps() -> None:
    h = parse_sim_health(REPLICA_METRICS)
    assert h.lag_buckets == {0.001: 90.0, 0.01: 99.0, float("inf"): 100.0}
    assert (h.lag_count, h.lag_sum, h.clock_jump_s) == (100.0, 0.2, 0.5)


@pytest.mark.parametrize(
    ("after", "steps", "mean", "p99", "jump"),
    [
        # 100 new steps, 99 of them within 1 ms: p99 <= 1 ms
        ({0.001: 99.0, 0.01: 100.0, float("inf"): 100.0}, 100, 0.001, 0.001, 0.0),
        # 100 new steps, only 98 within 1 ms and all within 10 ms: p99 <= 10 ms
        ({0.001: 98.0, 0.01: 100.0, float("inf"): 100.0}, 100, 0.001, 0.01, 0.0),
        # 10 steps beyond every bound
        ({0.001: 0.0, 0.01: 0.0, float("inf"): 10.0}, 10, 0.01, float("inf"), 0.0),
    ],
)
def test_sim_health_delta_over_a_run(
    after: dict[float, float], steps: int, mean: float, p99: float, jump: float
) -> None:
    before = SimHealth({0.001: 0.0, 0.01: 0.0, float("inf"): 0.0}, 0.0, 0.0, 1.0)
    count = after[float("inf")]
    delta = sim_health_delta(before, SimHealth(after, count, mean * count, 1.0 + jump))
    assert (delta.steps, delta.lag_p99_s, delta.clock_jump_s) == (steps, p99, jump)
    assert delta.lag_mean_s == pytest.approx(mean)


def test_sim_health_delta_without_steps() -> None:
    h = SimHealth({}, 5.0, 0.1, 0.0)
    assert sim_health_delta(h, h).lag_mean_s is None


def test_gateway_gauges() -> None:
    text = (
        'kvgate_prefix_index_keys{replica="r0"} 10.0\nkvgate_prefix_index_keys{replica="r1"} 5.0\n'
        'kvgate_admissions_total{tenant="a",band="standard",path="queued"} 3.0\n'
        'kvgate_admissions_total{tenant="a",band="standard",path="direct"} 30.0\n'
        'kvgate_rejections_total{tenant="a",reason="shed"} 2.0\n'
    )
    g = parse_gateway_gauges(text)
    assert (g.index_keys, g.queued, g.rejected) == (15.0, 3.0, 2.0)


# --- against the simulator ------------------------------------------------------------------------


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(replicas=2, profile="tiny", time_scale=1.0) as f:
        yield f


async def _cached_tokens(url: str, seed: int = 0) -> int:
    work = RandomWorkload(requests=1, prompt_tokens=200, output_tokens=2, model=MODEL, seed=seed)
    run = await run_load(url, work.requests(), LoadConfig(concurrency=1, duration_s=20))
    (trace,) = run.traces
    assert trace.ok and trace.cached_tokens is not None
    return trace.cached_tokens


@pytest.mark.timeout(30)
async def test_reset_empties_the_prefix_cache_of_every_replica(fleet: SimFleet) -> None:
    for url in fleet.urls:
        await _cached_tokens(url)
        assert await _cached_tokens(url) > 0  # the same prompt again: cached
    async with aiohttp.ClientSession() as session:
        assert await bench_fleet.reset_prefix_caches(session, fleet.urls) == 1
    for url in fleet.urls:
        assert await _cached_tokens(url) == 0


async def _until_busy(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(2000):
        if not (await bench_fleet.fleet_load(session, [url]))[url].idle:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{url} never got busy")


@pytest.mark.timeout(30)
async def test_reset_waits_for_running_requests_then_resets(fleet: SimFleet) -> None:
    url = fleet.urls[0]
    await _cached_tokens(url, seed=1)
    slow = RandomWorkload(requests=1, prompt_tokens=64, output_tokens=150, model=MODEL, seed=2)
    running = asyncio.create_task(run_load(url, slow.requests(), LoadConfig(concurrency=1, duration_s=20)))
    async with aiohttp.ClientSession() as session:
        await _until_busy(session, url)
        await bench_fleet.reset_prefix_caches(session, fleet.urls)
        reset_done = time.perf_counter()
    result = await running
    assert result.traces[0].ok and result.traces[0].end <= reset_done
    assert await _cached_tokens(url, seed=1) == 0


@pytest.mark.timeout(30)
async def test_wait_idle_times_out_while_a_replica_is_busy(fleet: SimFleet) -> None:
    url = fleet.urls[1]
    slow = RandomWorkload(requests=1, prompt_tokens=64, output_tokens=400, model=MODEL, seed=3)
    running = asyncio.create_task(run_load(url, slow.requests(), LoadConfig(concurrency=1, duration_s=20)))
    async with aiohttp.ClientSession() as session:
        await _until_busy(session, url)
        with pytest.raises(TimeoutError, match="busy"):
            await bench_fleet.wait_idle(session, fleet.urls, timeout_s=0.05)
        await bench_fleet.wait_idle(session, fleet.urls, timeout_s=10)
    assert (await running).traces[0].ok
