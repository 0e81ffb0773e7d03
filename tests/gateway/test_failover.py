"""Reliability over real loopback HTTP: dead, sick, hung and crashing replicas; clients that leave."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway import tenant_status
from gateway.config import parse_config
from gateway.server import GatewayServer
from gateway.tokenizers import SimTokenizer
from simulator.server.faults import FaultConfig
from tests.gateway.scripted_replica import (
    LAST_CHUNK,
    SSE_HEAD,
    Scripted,
    chunk,
    scripted,
    serves_vllm,
    until_closed,
)
from tests.gateway.stack import MODEL, chat, merge, metric_value, stack, wait_for
from tests.gateway.tenancy_stack import ADMIN_KEY, auth, tenancy_stack, tenant


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
    # Non-streaming answers arrive whole, so their first byte is bounded by response_timeout_s. The
    # bounds leave the healthy replica seconds to answer on a loaded machine (0.3 s did not: its
    # answer timed out too, a 504); the hung one stays out for the test (eject_backoff_s).
    cfg = {
        "upstream": {"first_byte_timeout_s": 2.0, "response_timeout_s": 3.0},
        "fleet": {"eject_after_failures": 1, "eject_backoff_s": 60.0, "eject_backoff_max_s": 60.0},
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


async def test_a_replica_stalling_early_in_a_stream_is_cut_off_and_the_tenant_settled() -> None:
    """The replica sends two chunks at once and then nothing, socket open: the client gets an error
    event and [DONE] within the chunk timeout, and the tenant's slot and reservation come back (it is
    charged the documented estimate: prompt + events relayed)."""
    capacity = 1000
    cfg = {
        "tenants": [tenant("acme", limits={"tpm": 1, "tpm_burst": capacity, "max_concurrency": 1})],
        "upstream": {"chunk_timeout_s": 0.5},
    }
    async with tenancy_stack(cfg, replicas=1, hang_after_chunks=2) as s:
        body = chat("stall early " * 10, max_tokens=20, stream=True, model="hang-llama")
        async with asyncio.timeout(5), s.client.stream(
            "POST", "/v1/chat/completions", json=body, headers=auth("acme")
        ) as r:
            assert r.status_code == 200
            events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        assert len(events) == 4 and events[-1] == "data: [DONE]"
        assert orjson.loads(events[-2][6:])["error"]["code"] == 502
        gw = s.gateway
        acme = gw.tenancy.find("acme")
        await wait_for(lambda: tenant_status.summary(gw.tenancy, acme)["in_flight"] == 0, timeout=5)
        assert gw.tenancy.admission is not None and gw.tenancy.admission.in_flight_of("acme") == 0
        assert await metric_value(s.client, "kvgate_upstream_errors_total", {"kind": "stream_timeout"}) == 1
        prompt = len(SimTokenizer().encode_chat(body["messages"]))
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        buckets = (await s.client.get("/admin/tenants/acme", headers=admin)).json()["buckets"]
        level = buckets["tokens"]["level"]
        assert capacity - (prompt + 2) <= level <= capacity - (prompt + 2) + 1  # refills 1/60 token/s
        # max_concurrency 1: the slot is free again
        r2 = await s.client.post("/v1/chat/completions", json=chat("next"), headers=auth("acme"))
        assert r2.status_code == 200


@contextlib.asynccontextmanager
async def gateway_over(replica_url: str, config: dict[str, Any]) -> AsyncIterator[GatewayServer]:
    """kvgate in front of one scripted replica (`serves_vllm`), once it has been scraped."""
    base = {
        "replicas": [{"url": replica_url, "model": MODEL, "name": "r0"}],
        "fleet": {"scrape_interval_s": 0.05, "health_interval_s": 0.1, "models_poll_interval_s": 0.2},
        "scheduling": {"seed": 1},
    }
    async with GatewayServer(parse_config(merge(base, config))) as server:
        await wait_for(server.gateway.ready)
        yield server


async def test_a_client_that_stops_reading_is_dropped_without_blaming_the_replica(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A real client on loopback with a small receive buffer asks for a stream and reads nothing, while
    the replica streams far more than the sockets in between hold. Once kvgate's sends to the client
    stay blocked for send_timeout_s, the request ends as the client's doing: recorded 499, the upstream
    request closed, the replica neither reported nor ejected, and the client's connection ends."""
    token = b'data: {"choices":[{"index":0,"delta":{"content":" zaf"}}]}\n\n'

    async def floods(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        w.write(SSE_HEAD)
        piece = chunk(token * 400)  # ~24 KB
        for _ in range(4000):  # ~100 MB: more than any socket buffer between kvgate and the client
            w.write(piece)
            await w.drain()
        w.write(chunk(b"data: [DONE]\n\n") + LAST_CHUNK)
        await until_closed(r, state)

    capacity = 10**9
    cfg = {
        "server": {"send_timeout_s": 0.5},
        "fleet": {"eject_after_failures": 1},
        "tenants": [tenant("acme", limits={"tpm": 1, "tpm_burst": capacity})],
    }
    async with scripted(serves_vllm(floods)) as replica, gateway_over(replica.url, cfg) as server:
        gw = server.gateway
        loop = asyncio.get_running_loop()
        host, port = server.url.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window stays small
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (host, int(port)))
            body = orjson.dumps(chat("tell me everything", max_tokens=3500, stream=True))
            head = (
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: kvgate\r\ncontent-type: application/json\r\n"
                b"authorization: %s\r\n" % auth("acme")["authorization"].encode()
            )
            await loop.sock_sendall(sock, head + b"content-length: %d\r\n\r\n" % len(body) + body)

            def sample(name: str, **labels: str) -> float:
                return gw.metrics.registry.get_sample_value(name, labels) or 0.0

            await wait_for(lambda: sample("kvgate_requests_total", model=MODEL, status="499") == 1, 15)
            await asyncio.wait_for(replica.eof.wait(), 5)  # the upstream request was closed
            assert sample("kvgate_slow_clients_total") == 1
            assert sample("kvgate_upstream_errors_total", replica="r0", kind="stream_timeout") == 0
            assert sample("kvgate_client_disconnects_total") == 0
            assert gw.fleet.snapshot().replicas[0].healthy
            # The tenant is settled: its slot back, charged what was relayed (no usage came: prompt +
            # events, per charge_for), and its bucket holds exactly that charge.
            acme = gw.tenancy.find("acme")
            await wait_for(lambda: tenant_status.summary(gw.tenancy, acme)["in_flight"] == 0, 5)
            assert gw.tenancy.admission is not None and gw.tenancy.admission.in_flight_of("acme") == 0
            used = tenant_status.summary(gw.tenancy, acme)["used"]
            # Hundreds of events went out, but a replica cannot make a request cost more than its
            # prompt and the output it may produce (charge_for caps the estimate at max_tokens).
            assert used["requests"] == 1 and 100 < used["tokens"] <= 3500 + 20
            level = (await tenant_status.status(gw.tenancy, acme))["buckets"]["tokens"]["level"]
            assert capacity - used["tokens"] <= level <= capacity - used["tokens"] + 1
            # What the client gets when it reads at last: the start of the stream, then the end of the
            # connection, without [DONE] (an unfinished chunked body: the client can tell).
            got = bytearray()
            async with asyncio.timeout(10):
                while data := await loop.sock_recv(sock, 1 << 16):
                    got += data
            assert got.startswith(b"HTTP/1.1 200") and b"data: [DONE]" not in got
        finally:
            sock.close()
    # kvgate dropped the connection itself (its transport aborted), so the server has no unfinished
    # response to complain about.
    assert not [r for r in caplog.records if "without completing response" in r.getMessage()]
