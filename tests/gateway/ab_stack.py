"""Helpers for the A/B routing tests: a fleet serving a base model and an adapter, a route over them,
and many requests at once through aiohttp (httpx is several times slower at this concurrency)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp

from tests.gateway.stack import MODEL
from tests.gateway.tenancy_stack import ADMIN_KEY

V2 = f"{MODEL}:chat-v2"  # canonical name of the adapter the simulated replicas serve as "chat-v2"
V3 = f"{MODEL}:chat-v3"  # an adapter no replica holds at start; kvgate may load it from models[]
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


def route(**kw: Any) -> dict[str, Any]:
    """The route "chat": 90% the base model, 10% the chat-v2 adapter, sticky by x-session-id."""
    return {
        "name": "chat",
        "targets": [{"model": MODEL, "weight": 90}, {"model": V2, "weight": 10}],
        "sticky_by": ["header:x-session-id"],
        **kw,
    }


async def targets_of(
    base_url: str,
    keys: Iterable[str],
    *,
    model: str = "chat",
    headers: Mapping[str, str] | None = None,
    concurrency: int = 32,
) -> dict[str, tuple[int, str | None]]:
    """(status, x-kvgate-target) of one small completion per sticky key (sent as x-session-id)."""
    out: dict[str, tuple[int, str | None]] = {}
    todo = iter(keys)
    body = {"model": model, "prompt": "hi", "max_tokens": 1}
    async with aiohttp.ClientSession(base_url) as session:

        async def worker() -> None:
            for key in todo:
                h = {"x-session-id": key, **(headers or {})}
                async with session.post("/v1/completions", json=body, headers=h) as r:
                    await r.read()
                    out[key] = (r.status, r.headers.get("x-kvgate-target"))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out
