"""Reliability over real loopback HTTP: dead, sick, hung and crashing replicas; clients that leave."""

from __future__ import annotations

import asyncio

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from simulator.server.faults import FaultConfig
from tests.gateway.stack import chat, metric_value, stack, wait_for


async def replica_metric(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    async with httpx.AsyncClient() as c:
        text = (await c.get(url + "/metrics")).text
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == name and all(smp.labels.get(k) == v for k, v in (labels or {}).items()):
                total += smp.value
    return total


async def test_failing_health_ejects_the_replica() -> None:
    cfg = {"fleet": {"eject_after_failures": 1, "health_interval_s": 0.05}}
    async with stack(replicas=2, config=cfg) as s:
        s.fleet.replica(1).set_faults(health_status=503)
        await wait_for(lambda: not s.gateway.fleet.snapshot().replicas[1].healthy)
        for i in range(10):
            r = await s.client.post("/v1/chat/completions", json=chat(f"distinct {i} " * 30, max_tokens=2))
            assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "r0"
        s.fleet.replica(1).clear_faults()
        await wait_for(lambda: s.gateway.fleet.snapshot().replicas[1].healthy, timeout=15)


async def test_killed_replica_stops_receiving_traffic_and_requests_still_succeed() -> None:
    async with stack(replicas=2) as s:
        await s.fleet.stop_replica(1)
        for i in range(10):  # the first may fail over (connect refused); none may fail
            r = await s.client.post("/v1/chat/completions", json=chat(f"after kill {i} " * 30, max_tokens=2))
            assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "r0"
        retries = await metric_value(s.client, "kvgate_retries_total")
        assert retries <= 1  # ejected at the first refused connection (or by the scraper before it)
        assert not s.gateway.fleet.snapshot().replicas[1].healthy


async def test_503_before_first_byte_fails_over_and_500_passes_through() -> None:
    faults = [FaultConfig(error_rate=1.0, error_status=503), None]
    async with stack(replicas=2, faults=faults) as s:
        for i in range(6):
            r = await s.client.post("/v1/chat/completions", json=chat(f"retry me {i} " * 30, max_tokens=2))
            assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "r1"
        assert await metric_value(s.client, "kvgate_upstream_errors_total", {"replica": "r0"}) >= 1
    faults = [FaultConfig(error_rate=1.0, error_status=500)]
    async with stack(replicas=1, faults=faults) as s:
        r = await s.client.post("/v1/chat/completions", json=chat("boom", max_tokens=2))
        assert r.status_code == 500 and "error" in r.json()  # the replica's own error, unchanged


async def test_hung_replica_times_out_before_first_byte_and_fails_over() -> None:
    faults = [FaultConfig(hang_after_chunks=0), None]
    # Non-streaming answers arrive whole, so their first byte is bounded by response_timeout_s.
    cfg = {
        "upstream": {"first_byte_timeout_s": 0.3, "response_timeout_s": 1.0},
        "fleet": {"eject_after_failures": 1},
    }
    async with stack(replicas=2, faults=faults, config=cfg) as s:
        for i in range(4):
            body = chat(f"hang test {i} " * 30, max_tokens=3, stream=i % 2 == 0)
            r = await s.client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "r1"
        assert await metric_value(s.client, "kvgate_upstream_errors_total", {"kind": "timeout"}) >= 1


async def test_all_replicas_down_is_a_clean_openai_error() -> None:
    async with stack(replicas=1) as s:
        await s.fleet.stop_replica(0)
        r = await s.client.post("/v1/chat/completions", json=chat("anyone?", max_tokens=2))
        assert r.status_code in (502, 503)
        assert r.json()["error"]["code"] == r.status_code


async def test_crash_mid_stream_ends_with_error_event_and_done() -> None:
    async with stack(replicas=1, faults=[FaultConfig(crash_after_chunks=3)]) as s:
        body = chat("crash " * 20, max_tokens=50, stream=True)
        async with asyncio.timeout(10), s.client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        err = orjson.loads(events[-2][6:])
        assert err["error"]["code"] == 502
        assert len(events) >= 3


async def test_replica_killed_mid_stream_does_not_hang_the_client() -> None:
    async with stack(replicas=1, time_scale=5.0) as s:
        body = chat("long answer " * 20, max_tokens=400, stream=True)
        async with asyncio.timeout(10), s.client.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = r.aiter_lines()
            got = 0
            async for line in lines:
                if line.startswith("data: "):
                    got += 1
                    if got == 3:
                        break
            await s.fleet.stop_replica(0)
            rest = [line async for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and '"error"' in rest[-2]


async def test_client_disconnect_aborts_the_request_on_the_replica() -> None:
    async with stack(replicas=1, time_scale=5.0) as s:
        url = s.fleet.urls[0]
        body = chat("stop early " * 20, max_tokens=500, stream=True)
        async with s.client.stream("POST", "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break  # leave after the first chunk
        await wait_for(
            lambda: s.fleet.replica(0).stats.num_running == 0 and s.fleet.replica(0).stats.num_waiting == 0,
            timeout=5,
        )
        assert await replica_metric(url, "vllm:request_success_total", {"finished_reason": "abort"}) == 1
        assert await replica_metric(url, "vllm:kv_cache_usage_perc") == 0.0
        await wait_for(lambda: s.gateway.fleet.snapshot().replicas[0].in_flight == 0)
        # non-streaming too: the client gives up while the replica is still generating
        with_timeout = httpx.AsyncClient(base_url=s.server.url, timeout=0.3)
        try:
            await with_timeout.post("/v1/chat/completions", json=chat("slow " * 20, max_tokens=500))
        except httpx.TimeoutException:
            pass
        finally:
            await with_timeout.aclose()

        async def aborted() -> float:
            return await replica_metric(url, "vllm:request_success_total", {"finished_reason": "abort"})

        for _ in range(100):
            if await aborted() == 2:
                break
            await asyncio.sleep(0.05)
        assert await aborted() == 2
        assert await metric_value(s.client, "kvgate_client_disconnects_total") == 2
