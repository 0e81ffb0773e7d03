"""Pods on loopback: simulated replicas that each have their own IP (127.0.0.x) and the same port, as
pods behind one Service do, and a kvgate whose only replicas are the ones discovery finds."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from gateway.config import parse_config
from gateway.server import GatewayServer
from loadtests.ports import free_port
from simulator.fleet import SimFleet
from tests.gateway.stack import MODEL, merge

FAST_FLEET = {"scrape_interval_s": 0.05, "health_interval_s": 0.1, "models_poll_interval_s": 0.2}


def free_port_on(ips: list[str]) -> int:
    """A port free on every address of `ips`."""
    return free_port(ips[0], also=ips[1:])


@dataclass
class Pods:
    """Simulated replicas, one per loopback IP, all on `port`. `start(ip)` adds one later."""

    port: int
    fleets: dict[str, SimFleet] = field(default_factory=dict)
    stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    async def start(self, ip: str, **fleet_kw: Any) -> SimFleet:
        fleet_kw.setdefault("profile", "tiny")
        fleet = SimFleet(replicas=1, host=ip, base_port=self.port, **fleet_kw)
        self.fleets[ip] = await self.stack.enter_async_context(fleet)
        return fleet


@contextlib.asynccontextmanager
async def pods(ips: list[str], spare: int = 2, **fleet_kw: Any) -> AsyncIterator[Pods]:
    """Start a replica on each of `ips`; the port is also free on `spare` more addresses after them."""
    last = int(ips[-1].rsplit(".", 1)[1])
    extra = [f"127.0.0.{last + i + 1}" for i in range(spare)]
    p = Pods(free_port_on(ips + extra))
    async with p.stack:
        for ip in ips:
            await p.start(ip, **fleet_kw)
        yield p


@dataclass
class Kvgate:
    server: GatewayServer
    client: httpx.AsyncClient

    @property
    def gateway(self) -> Any:
        return self.server.gateway

    def states(self) -> dict[str, str]:
        """Replica name -> its phase, as the fleet has it now."""
        return {r.name: r.phase.value for r in self.gateway.fleet.snapshot().replicas}


@contextlib.asynccontextmanager
async def kvgate(config: Mapping[str, Any]) -> AsyncIterator[Kvgate]:
    base: dict[str, Any] = {
        "fleet": FAST_FLEET,
        "upstream": {"connect_timeout_s": 3, "first_byte_timeout_s": 10, "chunk_timeout_s": 5},
        "server": {"debug_headers": True},
        "scheduling": {"seed": 1},
    }
    server = GatewayServer(parse_config(merge(base, config)))
    async with server, httpx.AsyncClient(base_url=server.url, timeout=20) as client:
        yield Kvgate(server, client)


async def until(pred: Any, timeout: float = 10.0, what: str = "condition") -> None:
    """Wait (bounded, polling the loop) until `pred()` is true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise TimeoutError(f"{what} not met within {timeout}s")
        await asyncio.sleep(0.02)


def chat(text: str, max_tokens: int = 3, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, **kw}
