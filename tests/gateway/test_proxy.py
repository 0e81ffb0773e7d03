"""`ProxyEndpoint` edge cases over real loopback HTTP: what each ending leaves behind.

test_proxy_bad_input covers the 4xx answers to bad bodies and test_proxy_serving the happy paths;
here: the "no replica" 503 and what it keeps alive, and the order of the request's first steps.
"""

from __future__ import annotations

import contextlib
import gc
import socket
import sys
import types
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from gateway import proxy
from gateway.config import parse_config
from gateway.server import GatewayServer
from tests.gateway.stack import MODEL, chat, merge


def closed_port() -> int:
    """A loopback port nothing listens on: a replica there is never scraped, so never routable."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def unroutable(config: Mapping[str, Any] | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """kvgate whose one replica never answers, flow control off: every request that gets as far as
    routing is a "no replica" 503."""
    base = {
        "replicas": [{"url": f"http://127.0.0.1:{closed_port()}", "model": MODEL, "name": "dead"}],
        "flow_control": {"enabled": False},
    }
    cfg = parse_config(merge(base, config or {}))
    async with GatewayServer(cfg) as srv, httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        yield client


def _live_request_frames() -> list[types.FrameType]:
    code = proxy.ProxyEndpoint.__call__.__code__
    return [o for o in gc.get_objects() if isinstance(o, types.FrameType) and o.f_code is code]


def _module_exceptions_with_traceback() -> list[str]:
    out = []
    for name, mod in list(sys.modules.items()):
        if not name.startswith(("gateway", "policies")):
            continue
        for attr, value in vars(mod).items():
            if isinstance(value, BaseException) and value.__traceback__ is not None:
                out.append(f"{name}.{attr}")
    return out


async def test_no_replica_503_keeps_nothing_of_the_request_alive() -> None:
    # Each 503 used to re-raise one module-level GatewayError: its traceback grew by the request's
    # frames (holding the body, up to 4 MiB) on every raise, for as long as no replica could serve.
    async with unroutable() as client:
        for _ in range(3):
            r = await client.post("/v1/chat/completions", json=chat("x" * 200_000))
            assert r.status_code == 503, r.text
            assert r.json()["error"]["message"] == "no replica can serve this model right now"
    assert _module_exceptions_with_traceback() == []
    gc.collect()
    assert _live_request_frames() == []
