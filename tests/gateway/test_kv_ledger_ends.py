"""Every way a request ends frees its place in the latency model's ledgers, over real loopback HTTP.

The latency gate holds requests while the KV ledger says no replica has blocks for them
(gateway/latency_gate.py), so an entry left behind would hold back a replica's share of the pool for
as long as the ledger believes it (`LOST_AFTER_S`). Each test drives one ending — a replica's error
before the first byte and the failover, a crash mid-stream, a hung replica timed out, a client that
leaves mid-stream or before a whole answer — and then requires both ledgers (the prefill ledger and
the KV-block ledger) empty on every replica.
"""

from __future__ import annotations

import asyncio

import httpx

from simulator.server.faults import FaultConfig
from tests.gateway.stack import Stack, chat, stack, wait_for


def ledgers_empty(s: Stack) -> bool:
    est = s.gateway.router.latency
    names = [r.name for r in s.gateway.fleet.snapshot().replicas]
    models = est.models()
    prefill = all(models[n].pending_requests == 0 for n in names if n in models)
    return prefill and all(est.kv_in_flight(n) == 0 for n in names)


async def test_an_error_before_the_first_byte_and_the_failover_leave_no_entry() -> None:
    faults = [FaultConfig(error_rate=1.0, error_status=503), None]
    async with stack(replicas=2, faults=faults) as s:
        for i in range(4):
            body = chat(f"fail over {i} " * 30, max_tokens=3, stream=i % 2 == 0)
            r = await s.client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "r1"
        await wait_for(lambda: ledgers_empty(s), timeout=5)


async def test_a_crash_mid_stream_leaves_no_entry() -> None:
    async with stack(replicas=1, faults=[FaultConfig(crash_after_chunks=3)]) as s:
        body = chat("crash " * 20, max_tokens=50, stream=True)
        async with asyncio.timeout(10), s.client.stream("POST", "/v1/chat/completions", json=body) as r:
            events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and '"error"' in events[-2]
        await wait_for(lambda: ledgers_empty(s), timeout=5)


async def test_a_hung_replica_timed_out_leaves_no_entry() -> None:
    faults = [FaultConfig(hang_after_chunks=0), None]
    cfg = {
        "upstream": {"first_byte_timeout_s": 1.0, "response_timeout_s": 3.0},
        "fleet": {"eject_after_failures": 1, "eject_backoff_s": 60.0, "eject_backoff_max_s": 60.0},
    }
    async with stack(replicas=2, faults=faults, config=cfg) as s:
        for i in range(2):
            body = chat(f"hang {i} " * 30, max_tokens=3, stream=i == 0)
            r = await s.client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "r1"
        await wait_for(lambda: ledgers_empty(s), timeout=5)


async def test_a_client_that_leaves_leaves_no_entry() -> None:
    async with stack(replicas=1, time_scale=5.0) as s:
        body = chat("leave early " * 20, max_tokens=500, stream=True)
        async with s.client.stream("POST", "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break  # leave after the first chunk: the request is running, holding blocks
            assert s.gateway.router.latency.kv_in_flight("r0") == 1
        await wait_for(lambda: ledgers_empty(s), timeout=5)
        # A non-streaming answer the client gives up on while the replica generates it.
        impatient = httpx.AsyncClient(base_url=s.server.url, timeout=0.3)
        try:
            await impatient.post("/v1/chat/completions", json=chat("slow " * 20, max_tokens=500))
        except httpx.TimeoutException:
            pass
        finally:
            await impatient.aclose()
        await wait_for(lambda: ledgers_empty(s), timeout=5)
