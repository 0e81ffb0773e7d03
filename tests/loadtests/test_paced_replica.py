"""The paced replica (loadtests/paced_replica.py): what kvgate reads from it and what a stream holds."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from gateway.fleet.metrics_parse import parse_metrics
from gateway.fleet.models_parse import parse_models
from loadtests.paced_replica import PacedReplica
from loadtests.sse_stream import SseStream


@pytest.fixture
async def replica() -> AsyncIterator[str]:
    runner = web.AppRunner(PacedReplica("tiny-llama", 0.001).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_kvgate_can_read_its_models_and_metrics(replica: str) -> None:
    async with aiohttp.ClientSession(replica) as s:
        async with s.get("/metrics") as r:
            metrics = parse_metrics(await r.text())
        async with s.get("/v1/models") as r:
            models = parse_models(await r.read())
    assert metrics.running == 0 and metrics.waiting == 0
    assert models.base_models == ("tiny-llama",)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_stream_is_max_tokens_content_chunks_then_usage_and_done(replica: str, path: str) -> None:
    body = {"model": "tiny-llama", "max_tokens": 5, "stream": True, "prompt": "hi", "messages": []}
    stream = SseStream()
    async with aiohttp.ClientSession(replica) as s, s.post(path, json=body) as r:
        async for data in r.content.iter_any():
            stream.feed(data, 0.0)
    stream.finish(0.0)
    assert stream.error is None and stream.done
    assert len(stream.chunk_times) == 5 and stream.completion_tokens == 5
