"""Faults on demand: the config's rules, and each fault over loopback HTTP, set at start-up or at runtime."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from simulator.fleet import SimFleet
from simulator.server.faults import FaultConfig, FaultState
from tests.simulator.scrape import eventually, metric

STREAM = {"prompt": "tell me", "max_tokens": 50, "stream": True}


@pytest.mark.parametrize(
    "changes",
    [{"error_rate": 1.5}, {"error_rate": -0.1}, {"error_rate": "x"}, {"error_status": 404}, {"slowdown": 0},
     {"slowdown": True}, {"crash_after_chunks": -1}, {"hang_after_chunks": 1.5}, {"health_status": 99},
     {"no_such_fault": 1}],
)
def test_bad_faults_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        FaultConfig().merged(changes)


def test_merge_keeps_other_fields_and_error_draws_follow_the_seed() -> None:
    config = FaultConfig(slowdown=2.0).merged({"error_rate": 0.5, "error_status": 503})
    assert (config.slowdown, config.error_rate, config.error_status) == (2.0, 0.5, 503)
    state = FaultState(config, seed=7)
    rng = random.Random(7)
    assert [state.draw_error() for _ in range(50)] == [503 if rng.random() < 0.5 else None for _ in range(50)]
    assert FaultState(FaultConfig(), seed=7).draw_error() is None


@asynccontextmanager
async def faulty(how: str, **faults: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A one-replica fleet with `faults` set at start-up or through `POST /sim/faults`."""
    startup = FaultConfig(**faults) if how == "startup" else None
    async with SimFleet(profile="tiny", faults=startup) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=httpx.Timeout(10, read=1.0)) as client:
        if how == "runtime":
            response = await client.post("/sim/faults", json=faults)
            assert response.status_code == 200
            assert response.json() == FaultConfig(**faults).as_dict()
        yield client


async def data_chunks(client: httpx.AsyncClient, payload: dict[str, Any]) -> tuple[int, BaseException | None]:
    """How many `data:` chunks a streamed response delivered, and the error that ended it (if any)."""
    chunks = 0
    try:
        async with client.stream("POST", "/v1/completions", json=payload) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    chunks += 1
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ReadTimeout) as exc:
        return chunks, exc
    return chunks, None


async def assert_freed(client: httpx.AsyncClient) -> None:
    async def freed() -> bool:
        return (await metric(client, "vllm:num_requests_running") == 0
                and await metric(client, "vllm:kv_cache_usage_perc") == 0.0)
    await eventually(freed)


HOW = pytest.mark.parametrize("how", ["startup", "runtime"])


@HOW
async def test_error_rate(how: str) -> None:
    async with faulty(how, error_rate=1.0, error_status=503) as client:
        response = await client.post("/v1/chat/completions",
                                     json={"messages": [{"role": "user", "content": "x"}]})
        assert response.status_code == 503
        assert response.json()["error"]["code"] == 503
        assert (await client.get("/health")).status_code == 200
        changed = await client.post("/sim/faults", json={"error_rate": 0.5, "error_status": 500})
        assert changed.status_code == 200
        statuses = [(await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})).status_code
                    for _ in range(20)]
    assert set(statuses) == {200, 500}


async def _one_request(client: httpx.AsyncClient) -> tuple[float, float, float]:
    """One 20-token request on an idle replica: its engine steps, their summed simulated duration
    (the modelled time, slowdown applied) and the request's reported e2e latency (simulated seconds)."""
    response = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 20})
    assert response.status_code == 200
    steps = await metric(client, "kvgate_sim_steps_total")
    modelled = await metric(client, "kvgate_sim_busy_wall_seconds_total") / await metric(
        client, "kvgate_sim_time_scale")
    return steps, modelled, await metric(client, "vllm:e2e_request_latency_seconds_sum")


@HOW
async def test_slowdown_stretches_simulated_time(how: str) -> None:
    # The step durations the engine computes are deterministic; the e2e latency also holds whatever
    # the simulator's clock skipped when the loaded machine scheduled it late (kvgate_sim_clock_jump),
    # so the baseline's latency is no yardstick. Compare the modelled step times, and check the
    # slowed request's latency covers its stretched steps (a clock jump only adds to it).
    async with faulty(how) as client:  # no faults: the baseline
        base_steps, base_modelled, base_e2e = await _one_request(client)
    async with faulty(how, slowdown=4.0) as client:
        slow_steps, slow_modelled, slow_e2e = await _one_request(client)
        assert await metric(client, "kvgate_sim_slowdown") == 4.0
    assert slow_steps == base_steps > 0  # the same steps...
    assert slow_modelled == pytest.approx(4.0 * base_modelled, rel=1e-9)  # ...each four times as long
    assert base_e2e >= base_modelled * (1 - 1e-9)
    assert slow_e2e >= 4.0 * base_modelled * (1 - 1e-9)


@HOW
async def test_crash_mid_stream_breaks_the_connection(how: str) -> None:
    async with faulty(how, crash_after_chunks=3) as client:
        chunks, error = await data_chunks(client, STREAM)
        assert (chunks, type(error)) == (3, httpx.RemoteProtocolError)
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 10})
        await assert_freed(client)
        assert await metric(client, "vllm:request_success_total", finished_reason="abort") == 2
        assert await metric(client, "vllm:request_success_total", finished_reason="length") == 0


@HOW
async def test_crash_before_the_first_byte(how: str) -> None:
    async with faulty(how, crash_after_chunks=0) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/v1/completions", json={"prompt": "x", "stream": True})
        assert (await client.get("/health")).status_code == 200


@HOW
async def test_hang_mid_stream_until_the_client_gives_up(how: str) -> None:
    async with faulty(how, hang_after_chunks=2) as client:
        chunks, error = await data_chunks(client, STREAM)
        assert (chunks, type(error)) == (2, httpx.ReadTimeout)
        await assert_freed(client)


@HOW
async def test_hang_without_answering(how: str) -> None:
    async with faulty(how, hang_after_chunks=0) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert await metric(client, "vllm:num_requests_running") == 0
        assert (await client.delete("/sim/faults")).json() == FaultConfig().as_dict()
        served = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert served.status_code == 200


@HOW
async def test_failing_health(how: str) -> None:
    async with faulty(how, health_status=503) as client:
        response = await client.get("/health")
        assert (response.status_code, response.content) == (503, b"")
        served = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert served.status_code == 200
        await client.delete("/sim/faults")
        assert (await client.get("/health")).status_code == 200


async def test_admin_endpoint_refuses_bad_faults() -> None:
    async with faulty("runtime") as client:
        assert (await client.get("/sim/faults")).json() == FaultConfig().as_dict()
        bad = await client.post("/sim/faults", json={"slowdown": -1})
        assert bad.status_code == 400
        assert "slowdown" in bad.json()["error"]["message"]
        assert (await client.post("/sim/faults", content=b"[")).status_code == 400
        assert (await client.get("/sim/faults")).json() == FaultConfig().as_dict()
