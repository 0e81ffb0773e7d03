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
from tests.gateway.raw_http import RawConnection, post_head
from tests.gateway.stack import MODEL, chat, merge
from tests.gateway.tenancy_stack import tenant


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


async def test_a_request_without_a_valid_key_is_refused_before_its_body_is_read() -> None:
    # An unauthenticated client must not make kvgate buffer a body (up to 4 MiB): the key is in the
    # headers, so the 401 comes before the body is read. Here the body never arrives at all.
    async with unroutable({"tenants": [tenant("a")]}) as client:
        url = str(client.base_url).rstrip("/")
        for key_header in ((), ("authorization: Bearer sk-wrong",)):
            conn = await RawConnection.open(url, timeout=3.0)
            try:
                await conn.send(post_head("/v1/chat/completions", 4_000_000, *key_header) + b'{"mod')
                r = await conn.response()
            finally:
                conn.close()
            assert r.status == 401
            assert r.json()["error"]["code"] in ("missing_api_key", "invalid_api_key")
