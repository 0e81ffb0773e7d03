"""A real stack on loopback for integration tests: simulated replicas + kvgate, in the test's loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import parse_config
from gateway.server import GatewayServer
from simulator.fleet import SimFleet

MODEL = "tiny-llama"


@dataclass
class Stack:
    fleet: SimFleet
    server: GatewayServer
    client: httpx.AsyncClient

    @property
    def gateway(self) -> Any:
        return self.server.gateway

    def replica_name(self, i: int) -> str:
        return f"r{i}"


def merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


@contextlib.asynccontextmanager
async def stack(
    replicas: int = 2,
    config: Mapping[str, Any] | None = None,
    wait_ready: bool = True,
    per_replica: Mapping[str, Mapping[str, Any]] | None = None,
    **fleet_kw: Any,
) -> AsyncIterator[Stack]:
    """`per_replica`: extra settings of the replica entries, by name (r0, r1, ...). A fleet started
    with `kv_events_port` has each replica's KV-event endpoints in its entry."""
    fleet_kw.setdefault("profile", "tiny")
    async with SimFleet(replicas=replicas, **fleet_kw) as fleet:
        extra = {
            f"r{i}": {"kv_events": e.pub, "kv_events_replay": e.replay}
            for i, e in enumerate(fleet.kv_event_endpoints)
        }
        for name, settings in (per_replica or {}).items():
            extra[name] = {**extra.get(name, {}), **settings}
        model = fleet_kw.get("model") or MODEL
        base = {
            "replicas": [
                {"url": u, "model": model, "name": f"r{i}", **extra.get(f"r{i}", {})}
                for i, u in enumerate(fleet.urls)
            ],
            # Health and scrape answers share the one loop with the test's own load: on a busy 2-core
            # machine a 0.5 s timeout ejected both replicas in the middle of a 23,000-request test.
            # Tests about timeouts set their own.
            "fleet": {
                "scrape_interval_s": 0.05, "health_interval_s": 0.1, "models_poll_interval_s": 0.2,
                "scrape_timeout_s": 2.0, "health_timeout_s": 3.0,
            },
            # Connecting is fast on loopback, but all of the test runs in one loop on a small machine.
            "upstream": {"connect_timeout_s": 3, "first_byte_timeout_s": 10, "chunk_timeout_s": 5},
            "server": {"debug_headers": True},
            "scheduling": {"seed": 1},
        }
        cfg = parse_config(merge(base, config or {}))
        server = GatewayServer(cfg)
        async with server, httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            s = Stack(fleet, server, client)
            if wait_ready:
                await wait_until_scraped(s)
            yield s


async def wait_until_scraped(s: Stack, timeout: float = 10.0) -> None:
    """Every running replica scraped at least once (and models polled), so routing sees the fleet."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        snap = s.gateway.fleet.snapshot()
        if all(r.scraped_at is not None for r in snap.replicas):
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("replicas were not scraped in time")


async def wait_for(pred: Any, timeout: float = 10.0, interval: float = 0.02) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if pred():
            return
        await asyncio.sleep(interval)
    raise TimeoutError("condition not met in time")


def chat(text: str, max_tokens: int = 4, **kw: Any) -> dict[str, Any]:
    return {
        "model": kw.pop("model", MODEL),
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        **kw,
    }


async def metric_value(
    client: httpx.AsyncClient, name: str, labels: Mapping[str, str] | None = None
) -> float:
    """Sum of the samples named `name` whose labels include `labels` on client's /metrics."""
    text = (await client.get("/metrics")).text
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items()):
                total += s.value
    return total
