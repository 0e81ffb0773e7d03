"""`ProxyEndpoint` edge cases over real loopback HTTP: what each ending leaves behind.

test_proxy_bad_input covers the 4xx answers to bad bodies and test_proxy_serving the happy paths;
here: the "no replica" 503 and what it keeps alive, and the order of the request's first steps.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import types
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from gateway import proxy, tenant_status
from gateway.config import parse_config
from gateway.gateway import Gateway
from gateway.server import GatewayServer
from loadtests.ports import free_port
from tests.gateway.raw_http import RawConnection, post_head
from tests.gateway.stack import MODEL, chat, merge, metric_value, wait_for
from tests.gateway.tenancy_stack import auth, tenancy_stack, tenant


def closed_port() -> int:
    """A loopback port nothing listens on: a replica there is never scraped, so never routable."""
    return free_port()


@contextlib.asynccontextmanager
async def unroutable(
    config: Mapping[str, Any] | None = None,
) -> AsyncIterator[tuple[httpx.AsyncClient, Gateway]]:
    """kvgate whose one replica never answers, flow control off: every request that gets as far as
    routing is a "no replica" 503. Yields a client of it and its Gateway."""
    base = {
        "replicas": [{"url": f"http://127.0.0.1:{closed_port()}", "model": MODEL, "name": "dead"}],
        "flow_control": {"enabled": False},
    }
    cfg = parse_config(merge(base, config or {}))
    async with GatewayServer(cfg) as srv, httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        yield client, srv.gateway


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
    async with unroutable() as (client, _):
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
    async with unroutable({"tenants": [tenant("a")]}) as (client, _):
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


async def test_every_other_method_is_a_405_before_auth_or_body() -> None:
    # test_proxy_bad_input covers GET on chat; here every method on both paths, with tenants (no
    # key sent: the 405 comes first) and a declared body that never arrives (it is not read).
    async with unroutable({"tenants": [tenant("a")]}) as (client, _):
        url = str(client.base_url).rstrip("/")
        for path in ("/v1/chat/completions", "/v1/completions"):
            for method in ("GET", "PUT", "PATCH", "DELETE"):
                conn = await RawConnection.open(url, timeout=3.0)
                try:
                    await conn.send(post_head(path, 1000).replace(b"POST", method.encode(), 1) + b"{")
                    r = await conn.response()
                finally:
                    conn.close()
                assert r.status == 405, (method, path)
                err = r.json()["error"]
                assert isinstance(err, dict) and err["type"] == "invalid_request_error"
                assert "POST" in str(err["message"]) and path in str(err["message"])
            r = await client.head(path)
            assert r.status_code == 405 and r.content == b""
        assert await metric_value(client, "kvgate_requests_total") == 0  # never started a request


class SettleLog:
    """Wraps `Tenancy.settle` to record each call's Admitted; the real settle still runs."""

    def __init__(self, tenancy: Any) -> None:
        self.calls: list[Any] = []
        real = tenancy.settle

        async def settle(admitted: Any, usage: Any, outcome: Any) -> None:
            self.calls.append(admitted)
            await real(admitted, usage, outcome)

        tenancy.settle = settle

    def take(self) -> list[Any]:
        out, self.calls = self.calls, []
        return out


def assert_openai_shaped(r: httpx.Response, status: int) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]


async def test_each_ending_settles_an_admitted_request_exactly_once() -> None:
    cfg = {"tenants": [tenant("t", limits={"rpm": 1000, "tpm": 1_000_000, "max_output_tokens": 64})]}
    async with tenancy_stack(cfg, replicas=1, time_scale=5.0) as s:
        c, gw, key = s.client, s.gateway, auth("t")
        log = SettleLog(gw.tenancy)

        async def settled(expected: int) -> None:
            """Once every request has ended: `expected` admitted requests settled, once each."""
            await wait_for(lambda: tenant_status.summary(gw.tenancy, gw.tenancy.find("t"))["in_flight"] == 0)
            await wait_for(lambda: gw.metrics.in_flight._value.get() == 0)
            calls = log.take()
            assert len(calls) == expected and len({id(a) for a in calls}) == expected
            assert all(a.settled for a in calls)

        # Refused before admission: nothing to settle.
        path = "/v1/chat/completions"
        assert_openai_shaped(await c.post(path, json=chat("x")), 401)
        assert_openai_shaped(await c.post(path, json={"model": MODEL}, headers=key), 400)
        assert_openai_shaped(await c.post(path, json=chat("x", model="nope"), headers=key), 404)
        assert_openai_shaped(await c.post(path, json=chat("x", max_tokens=65), headers=key), 400)  # cap
        bad_band = {**key, "x-kvgate-priority": "urgent"}
        assert_openai_shaped(await c.post(path, json=chat("x"), headers=bad_band), 400)
        await settled(0)

        # Answered: unary and streamed.
        assert (await c.post("/v1/chat/completions", json=chat("a", max_tokens=2), headers=key)).is_success
        async with c.stream(
            "POST", "/v1/chat/completions", json=chat("b", max_tokens=2, stream=True), headers=key
        ) as r:
            await r.aread()
        await settled(2)

        # The replica's own error, passed through (its simulator refuses a batch of prompts).
        batch = {"model": MODEL, "prompt": ["one", "two"], "max_tokens": 2}
        r = await c.post("/v1/completions", json=batch, headers=key)
        assert r.status_code == 400 and "Batched" in r.text
        await settled(1)

        # The client leaves mid-stream.
        body = chat("leave " * 10, max_tokens=60, stream=True)
        async with c.stream("POST", "/v1/chat/completions", json=body, headers=key) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break
        await settled(1)

        # A fault inside kvgate after admission: an OpenAI-shaped 500, still settled.
        real = gw.router.decide

        def broken(*args: Any, **kw: Any) -> Any:
            raise RuntimeError("injected")

        gw.router.decide = broken
        try:
            assert_openai_shaped(await c.post("/v1/chat/completions", json=chat("z"), headers=key), 500)
        finally:
            gw.router.decide = real
        await settled(1)


async def test_a_no_replica_503_after_admission_is_settled_once_and_charges_nothing() -> None:
    async with unroutable({"tenants": [tenant("t", limits={"rpm": 100, "tpm": 100_000})]}) as (client, gw):
        log = SettleLog(gw.tenancy)
        r = await client.post("/v1/chat/completions", json=chat("x"), headers=auth("t"))
        assert_openai_shaped(r, 503)
        assert "x-ratelimit-remaining-tokens" in r.headers
        assert len(log.take()) == 1
        summary = tenant_status.summary(gw.tenancy, gw.tenancy.find("t"))
        assert summary["in_flight"] == 0
        assert (summary["used"]["requests"], summary["used"]["tokens"]) == (0, 0)
