"""Test support: read a replica's /metrics the way a scraper does, and wait (bounded) for a condition."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


async def scrape(client: httpx.AsyncClient) -> dict[str, list[Sample]]:
    """Samples by sample name (e.g. `vllm:prefix_cache_hits_total`) from `GET /metrics`."""
    response = await client.get("/metrics")
    assert response.status_code == 200
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    """The one sample called `name` whose labels include `labels`."""
    found = [s.value for s in samples[name] if labels.items() <= s.labels.items()]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


async def metric(client: httpx.AsyncClient, name: str, **labels: str) -> float:
    return value(await scrape(client), name, **labels)


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 5.0,
                     interval: float = 0.005) -> None:
    """Poll `check` until it is true; fail after `timeout` seconds."""
    async with asyncio.timeout(timeout):
        while not await check():  # noqa: ASYNC110 - polling another process's state over HTTP
            await asyncio.sleep(interval)
