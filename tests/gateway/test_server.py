"""The server side of kvgate's sockets, with raw sockets on loopback writing exact bytes.

TCP_NODELAY on every accepted connection; the time a client may take to send its request headers
(`server.header_timeout_s`) and its body (`server.body_timeout_s`); the keep-alive idle timeout; and
the connection cap (`server.max_connections`). The timeouts bound RECEIVING a request only: a long
streamed answer is never cut by them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import parse_config
from gateway.server import GatewayServer
from loadtests.ports import free_port
from tests.gateway.raw_http import RawConnection, RawResponse, post_head
from tests.gateway.stack import MODEL, chat, merge, metric_value, stack
from tests.gateway.tenancy_stack import tenant

GET_HEALTH = b"GET /health HTTP/1.1\r\nhost: kvgate\r\n\r\n"


async def test_accepted_connections_have_tcp_nodelay() -> None:
    # Without it uvicorn's separate header and body writes wait ~40 ms for the client's delayed ACK.
    async with stack(replicas=1) as s:
        r = await s.client.post("/v1/chat/completions", json=chat("hi", max_tokens=2))
        assert r.status_code == 200
        server = s.server._server
        assert server is not None
        conns = list(server.server_state.connections)
        assert conns, "the keep-alive connection should still be open"
        for proto in conns:
            sock = proto.transport.get_extra_info("socket")  # type: ignore[attr-defined]
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


def _closed_port() -> int:
    return free_port()  # nothing listens there


@contextlib.asynccontextmanager
async def serving(server: Mapping[str, Any], **extra: Any) -> AsyncIterator[str]:
    """kvgate with these `server` settings and a replica that never answers (none is needed: these
    tests are about the client side); yields its URL."""
    base = {
        "replicas": [{"url": f"http://127.0.0.1:{_closed_port()}", "model": MODEL, "name": "dead"}],
        "server": dict(server),
    }
    async with GatewayServer(parse_config(merge(base, extra))) as srv:
        yield srv.url


def assert_408(r: RawResponse, part: str) -> None:
    assert r.status == 408
    assert r.headers["connection"] == "close"
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert isinstance(err, dict) and err["code"] == 408 and err["type"] == "invalid_request_error"
    assert f"the request {part} did not arrive within 0.3 s" == err["message"]


# The unfixed server never answered these: each wait below is bounded by the connection's read
# timeout (3 s), far above the configured timeout (0.3 s) and far below "forever".
FAST = {"header_timeout_s": 0.3, "body_timeout_s": 0.3}


async def test_half_the_headers_get_408_and_the_connection_closes() -> None:
    async with serving(FAST) as url:
        conn = await RawConnection.open(url, timeout=3.0)
        await conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: kvgate\r\ncontent-le")
        assert_408(await conn.response(), "headers")
        assert await conn.closed()


async def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout() -> None:
    async with serving(FAST) as url:
        conn = await RawConnection.open(url, timeout=3.0)
        # Closed, and nothing written: there was no request to answer.
        assert await asyncio.wait_for(conn.reader.read(), 3.0) == b""


async def test_a_short_body_gets_408_and_the_connection_closes() -> None:
    async with serving(FAST) as url:
        conn = await RawConnection.open(url, timeout=3.0)
        await conn.send(post_head("/v1/chat/completions", 100) + b'{"model":')
        assert_408(await conn.response(), "body")
        assert await conn.closed()


async def test_a_trickling_body_is_bounded_as_a_whole_not_byte_by_byte() -> None:
    # One byte every 0.1 s never leaves a gap as long as the body timeout; 100 bytes would take 10 s.
    async with serving(FAST) as url:
        conn = await RawConnection.open(url, timeout=3.0)
        await conn.send(post_head("/v1/chat/completions", 100))

        async def trickle() -> None:
            with contextlib.suppress(ConnectionError):
                for _ in range(100):
                    await conn.send(b" ")
                    await asyncio.sleep(0.1)

        task = asyncio.create_task(trickle())
        try:
            assert_408(await conn.response(), "body")
            assert await conn.closed()
        finally:
            task.cancel()


async def test_an_early_answer_does_not_leave_the_rest_of_the_body_unbounded() -> None:
    # A 401 goes out before the body is read; the body that never comes still ends the connection.
    async with serving(FAST, tenants=[tenant("a")]) as url:
        conn = await RawConnection.open(url, timeout=3.0)
        await conn.send(post_head("/v1/chat/completions", 4_000_000) + b'{"model":')
        assert (await conn.response()).status == 401
        assert await conn.closed()


async def test_an_idle_keep_alive_connection_waits_for_its_own_timeout() -> None:
    # Idle between requests is the keep-alive timeout's business, not the header timeout's.
    # The header timeout also bounds the first request's head, so it must outlast a connect and send
    # on a loaded machine (at 0.2 s a full parallel run once had the first request reset).
    async with serving({"header_timeout_s": 0.5, "keep_alive_timeout_s": 3.0}) as url:
        conn = await RawConnection.open(url, timeout=8.0)
        await conn.send(GET_HEALTH)
        assert (await conn.response()).status == 200
        await asyncio.sleep(1.5)  # three header timeouts
        await conn.send(GET_HEALTH)
        assert (await conn.response()).status == 200
        assert await conn.closed()  # by the keep-alive timeout, well within the 8 s read bound


async def test_connections_past_the_cap_get_503_with_retry_after_and_are_closed() -> None:
    async with serving({"max_connections": 2}) as url:
        held = [await RawConnection.open(url, timeout=3.0) for _ in range(2)]
        for conn in held:  # each answered: both are accepted and counted
            await conn.send(GET_HEALTH)
            assert (await conn.response()).status == 200
        extra = await RawConnection.open(url, timeout=3.0)
        await extra.send(GET_HEALTH)
        r = await extra.response()
        assert r.status == 503 and r.headers["retry-after"] == "1"
        assert r.headers["connection"] == "close"
        err = r.json()["error"]
        assert isinstance(err, dict) and err["type"] == "overloaded_error" and "connections" in err["message"]
        assert await extra.closed()
        async with httpx.AsyncClient(base_url=url) as client:  # a third connection: refused too
            r2 = await client.get("/metrics")
        assert r2.status_code == 503
        held.pop().close()  # a freed place is taken by the next connection
        for _ in range(100):
            conn = await RawConnection.open(url, timeout=3.0)
            await conn.send(GET_HEALTH)
            r = await conn.response()
            conn.close()
            if r.status == 200:
                break
            await asyncio.sleep(0.05)  # the server has not seen the close yet
        assert r.status == 200
        await held[0].send(b"GET /metrics HTTP/1.1\r\nhost: kvgate\r\n\r\n")  # a place it holds
        metrics = {
            smp.name: smp.value
            for fam in text_string_to_metric_families((await held[0].response()).body.decode())
            for smp in fam.samples
        }
        assert metrics["kvgate_client_connections_refused_total"] >= 2
        assert 1 <= metrics["kvgate_client_connections"] <= 2  # never more than the cap


async def test_a_streamed_answer_longer_than_both_timeouts_is_not_cut() -> None:
    # About 100 ms per token: 10 tokens stream for ~1 s, more than three times each timeout.
    async with stack(replicas=1, config={"server": FAST}, time_scale=50) as s:
        conn = await RawConnection.open(s.server.url, timeout=10.0)
        body = orjson.dumps(chat("tell me a story", max_tokens=10, stream=True))
        head = post_head("/v1/chat/completions", len(body))
        loop = asyncio.get_running_loop()

        async def streamed() -> None:
            started = loop.time()
            r = await conn.response()
            assert r.status == 200
            events = [e for e in r.body.split(b"\n\n") if e.startswith(b"data: ")]
            assert events[-1] == b"data: [DONE]" and len(events) >= 10
            assert loop.time() - started > 2 * FAST["body_timeout_s"]  # it did outlast the timeouts

        # The body a moment after the head: a body timer runs, and must end with the body.
        await conn.send(head)
        await asyncio.sleep(0.05)
        await conn.send(body)
        await streamed()
        # The connection is reused; half of a third request's head follows the second at once
        # (pipelined): its header timer waits for the answer under way, then runs out.
        await conn.send(head + body + b"POST /v1/chat/completions HTTP/1.1\r\nhost: kv")
        await streamed()
        assert_408(await conn.response(), "headers")
        assert await conn.closed()
        timeouts = await metric_value(s.client, "kvgate_client_request_timeouts_total", {"phase": "headers"})
        assert timeouts == 1
