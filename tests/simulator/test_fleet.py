"""SimFleet: replicas on loopback ports, hard stop and restart, and the thread-backed handle."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from loadtests.ports import free_port
from simulator.fleet import SimFleet
from simulator.server.faults import FaultConfig


async def test_replicas_serve_on_their_own_ports() -> None:
    async with SimFleet(replicas=3, profile="tiny") as fleet:
        assert len(set(fleet.urls)) == 3
        async with httpx.AsyncClient(timeout=5) as client:
            for url in fleet.urls:
                assert (await client.get(url + "/health")).status_code == 200
        assert fleet.replica(2).stats.num_running == 0


async def test_base_port_gives_consecutive_ports() -> None:
    # Another process may take a probed port before the fleet binds it: probe again (a few times,
    # rather than skipping the test the first time it happens).
    for _ in range(10):
        base = free_port(run=2)  # two consecutive ports, below the ephemeral range
        fleet = SimFleet(replicas=2, base_port=base)
        try:
            await fleet.start()
        except OSError:
            continue
        try:
            assert fleet.urls == [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
            async with httpx.AsyncClient(timeout=5) as client:
                for url in fleet.urls:
                    assert (await client.get(url + "/health")).status_code == 200
        finally:
            await fleet.stop()
        return
    pytest.fail("10 probed pairs of free ports were all taken before the fleet could bind them")


async def test_per_replica_faults() -> None:
    faults = [None, FaultConfig(health_status=503)]
    async with SimFleet(replicas=2, faults=faults) as fleet, httpx.AsyncClient(timeout=5) as client:
        assert [(await client.get(u + "/health")).status_code for u in fleet.urls] == [200, 503]
        fleet.replica(0).set_faults(health_status=500)
        assert (await client.get(fleet.urls[0] + "/health")).status_code == 500
        fleet.replica(0).clear_faults()
        assert (await client.get(fleet.urls[0] + "/health")).status_code == 200


async def test_stop_replica_breaks_streams_and_refuses_connections() -> None:
    async with SimFleet(replicas=2, time_scale=5.0) as fleet, httpx.AsyncClient(timeout=5) as client:
        url = fleet.urls[0]
        async with client.stream("POST", url + "/v1/completions",
                                 json={"prompt": "x", "max_tokens": 500, "stream": True}) as response:
            lines = response.aiter_lines()
            await anext(lines)
            await fleet.stop_replica(0)
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                async for _ in lines:
                    pass
        assert not fleet.is_running(0)
        with pytest.raises(httpx.ConnectError):
            await client.get(url + "/health")
        assert (await client.get(fleet.urls[1] + "/health")).status_code == 200

        await fleet.restart_replica(0)
        assert fleet.urls[0] == url
        assert (await client.get(url + "/health")).status_code == 200
        assert fleet.replica(0).stats.generation_tokens == 0  # a fresh process


async def test_two_fleets_in_one_loop_stop_cleanly() -> None:
    async with SimFleet(replicas=1) as a, SimFleet(replicas=1) as b, httpx.AsyncClient(timeout=5) as client:
        payload = {"prompt": "x", "max_tokens": 3}
        results = await asyncio.gather(*(client.post(u + "/v1/completions", json=payload)
                                         for u in a.urls + b.urls))
        assert [r.status_code for r in results] == [200, 200]


def test_thread_handle_for_sync_callers() -> None:
    handle = SimFleet.start_in_thread(replicas=2, profile="tiny")
    try:
        assert len(handle.urls) == 2
        with httpx.Client(timeout=5) as client:
            payload = {"prompt": "x", "max_tokens": 2}
            body = client.post(handle.urls[1] + "/v1/completions", json=payload).json()
            assert body["usage"]["completion_tokens"] == 2
            assert handle.set_faults(0, health_status=503).health_status == 503
            assert client.get(handle.urls[0] + "/health").status_code == 503
            handle.stop_replica(1)
            with pytest.raises(httpx.ConnectError):
                client.get(handle.urls[1] + "/health")
            handle.restart_replica(1)
            assert client.get(handle.urls[1] + "/health").status_code == 200
    finally:
        handle.stop()
    handle.stop()  # idempotent


def test_thread_handle_reports_start_up_errors() -> None:
    with pytest.raises(ValueError, match="unknown profile"):
        SimFleet.start_in_thread(profile="no-such-profile")
