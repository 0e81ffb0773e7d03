"""Helpers for the tenancy integration tests: keys, headers, and stacks with extra pools."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import httpx

from gateway.auth_keys import hash_key
from gateway.config import parse_config
from gateway.gateway import Gateway
from gateway.server import GatewayServer
from simulator.fleet import SimFleet
from simulator.server.faults import FaultConfig
from tests.gateway.stack import MODEL, Stack, merge, wait_until_scraped

ADMIN_KEY = "sk-admin-secret"


def key_of(tenant: str) -> str:
    return f"sk-test-{tenant}"


def tenant(name: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "api_keys": [hash_key(key_of(name))], **kw}


def auth(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key_of(name)}"}


def base_config(fleets: Sequence[tuple[SimFleet, str, str]]) -> dict[str, Any]:
    """Replicas for each (fleet, model, name prefix), fast scrapes, exact token counts."""
    models = sorted({m for _, m, _ in fleets})
    return {
        "replicas": [
            {"url": u, "model": m, "name": f"{prefix}{i}"}
            for fleet, m, prefix in fleets
            for i, u in enumerate(fleet.urls)
        ],
        "models": [{"name": m, "tokenizer": "sim"} for m in models],
        # Fast scrapes, but patient ones: these tests run hundreds of streams, the replicas and kvgate
        # in ONE event loop on a small machine, and a late scrape must not eject a healthy replica.
        "fleet": {
            "scrape_interval_s": 0.05,
            "scrape_timeout_s": 5.0,
            "stale_after_s": 5.0,
            "health_interval_s": 0.1,
            "health_timeout_s": 5.0,
            "eject_after_failures": 5,
            "models_poll_interval_s": 0.2,
        },
        "upstream": {"connect_timeout_s": 5, "first_byte_timeout_s": 30, "chunk_timeout_s": 30},
        "scheduling": {"seed": 1},
        "auth": {"admin_keys": [hash_key(ADMIN_KEY)]},
    }


@contextlib.asynccontextmanager
async def tenancy_stack(
    config: Mapping[str, Any],
    replicas: int = 2,
    hang_after_chunks: int | None = None,
    max_connections: int = 400,
    wall_clock: Callable[[], float] | None = None,
    **fleet_kw: Any,
) -> AsyncIterator[Stack]:
    """kvgate over `replicas` simulated replicas of MODEL and, with `hang_after_chunks`, one more
    replica serving "hang-llama" that stalls every stream after that many chunks. `wall_clock`
    replaces the gateway's Unix-time clock (quota windows, the ledger's hours)."""
    fleet_kw.setdefault("profile", "tiny")
    async with contextlib.AsyncExitStack() as stack:
        main = await stack.enter_async_context(SimFleet(replicas=replicas, **fleet_kw))
        fleets = [(main, MODEL, "r")]
        if hang_after_chunks is not None:
            hang = await stack.enter_async_context(
                SimFleet(replicas=1, profile="tiny", model="hang-llama",
                         faults=FaultConfig(hang_after_chunks=hang_after_chunks))
            )  # fmt: skip
            fleets.append((hang, "hang-llama", "h"))
        cfg = parse_config(merge(base_config(fleets), config))
        gateway = Gateway(cfg, wall_clock=wall_clock) if wall_clock is not None else None
        server = await stack.enter_async_context(GatewayServer(cfg, gateway=gateway))
        client = await stack.enter_async_context(
            httpx.AsyncClient(
                base_url=server.url,
                timeout=30,
                limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=50),
            )
        )
        s = Stack(main, server, client)
        await wait_until_scraped(s)
        yield s
