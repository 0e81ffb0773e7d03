"""The upstream client against hand-written servers: keep-alive, stale connections, broken and
malformed responses, flow control, cancellation. (The main paths run against the simulator in the
integration tests.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from pathlib import Path

import pytest

from gateway.upstream import BrokenError, ConnectError, UpstreamPool
from gateway.upstream.connection import HIGH_WATER
from tests.gateway.upstream.scripted import (
    Handler,
    content_length,
    read_head,
    read_request,
    reply,
    self_signed,
    server,
    until,
)


async def test_keep_alive_reuses_one_connection_and_echoes_bodies() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            body = await read_request(r)
            w.write(reply(body))
            await w.drain()

    async with server(handler) as (url, accepted):
        pool = UpstreamPool(connect_timeout_s=1)
        for i in range(3):
            resp = await pool.post(url, "/v1/completions", b'{"n": %d}' % i)
            assert resp.status == 200 and resp.headers["content-type"] == "application/json"
            assert await resp.read() == b'{"n": %d}' % i
            resp.release()
        assert len(accepted) == 1
        pool.close()


async def test_chunked_stream_arrives_de_chunked_and_in_order() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(5):
            data = b"data: %d\n\n" % i
            w.write(b"%x\r\n%s\r\n" % (len(data), data))
            await w.drain()
            await asyncio.sleep(0.005)
        w.write(b"0\r\n\r\n")
        await w.drain()
        await r.read()  # keep the connection until the client goes

    async with server(handler) as (url, _):
        pool = UpstreamPool(connect_timeout_s=1)
        resp = await pool.post(url, "/s", b"{}")
        got = b""
        while data := await resp.read_some():
            got += data
        assert got == b"".join(b"data: %d\n\n" % i for i in range(5))
        resp.release()
        pool.close()


async def test_a_stale_keep_alive_connection_is_retried_on_a_fresh_one() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(reply(b"ok"))
        await w.drain()
        # then close the connection, as a server's keep-alive timeout does

    async with server(handler) as (url, accepted):
        pool = UpstreamPool(connect_timeout_s=1)
        first = await pool.post(url, "/a", b"{}")
        assert await first.read() == b"ok"
        first.release()
        await asyncio.sleep(0)  # the FIN may or may not have been seen yet: both must work
        second = await pool.post(url, "/a", b"{}")
        assert second.status == 200 and await second.read() == b"ok"
        second.release()
        assert len(accepted) == 2
        pool.close()


async def test_refused_connection_is_a_connect_error() -> None:
    async with server(lambda r, w: asyncio.sleep(0)) as (url, _):
        pass  # closed: the port now refuses
    pool = UpstreamPool(connect_timeout_s=1)
    with pytest.raises(ConnectError):
        await pool.post(url, "/x", b"{}")


async def test_connection_dropped_mid_body_is_broken_after_a_response() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await w.drain()
        w.transport.abort()

    async with server(handler) as (url, _):
        pool = UpstreamPool(connect_timeout_s=1)
        resp = await pool.post(url, "/x", b"{}")
        with pytest.raises(BrokenError) as ei:
            while await resp.read_some():
                pass
        assert ei.value.got_response
        resp.close()
        pool.close()


async def test_no_answer_at_all_is_broken_without_a_response() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.transport.abort()

    async with server(handler) as (url, _):
        pool = UpstreamPool(connect_timeout_s=1)
        with pytest.raises(BrokenError) as ei:
            await pool.post(url, "/x", b"{}")
        assert not ei.value.got_response


async def test_malformed_response_is_broken() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"SPDY/9 banana\r\n\r\n")
        await w.drain()
        await r.read()

    async with server(handler) as (url, _):
        pool = UpstreamPool(connect_timeout_s=1)
        with pytest.raises(BrokenError, match="malformed"):
            await pool.post(url, "/x", b"{}")


async def test_a_large_body_pauses_and_resumes_reading() -> None:
    size = 3 * HIGH_WATER

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(reply(b"x" * size))
        await w.drain()
        await r.read()

    async with server(handler) as (url, _):
        pool = UpstreamPool(connect_timeout_s=1)
        resp = await pool.post(url, "/big", b"{}")
        await asyncio.sleep(0.1)  # let the server push: the client must stop reading at HIGH_WATER
        conn = resp._conn
        assert conn._paused and conn._buffered <= HIGH_WATER + 256 * 1024
        assert len(await resp.read()) == size
        resp.release()
        pool.close()


async def test_cancelling_a_read_closes_the_connection_on_the_server() -> None:
    server_saw_eof = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await w.drain()
        await r.read()  # returns at EOF: the client dropped the connection
        server_saw_eof.set()

    async with server(handler) as (url, _):
        pool = UpstreamPool(connect_timeout_s=1)
        resp = await pool.post(url, "/slow", b"{}")
        task = asyncio.create_task(resp.read_some())
        await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        resp.close()
        await asyncio.wait_for(server_saw_eof.wait(), 2)
        pool.close()


async def test_bytes_on_an_idle_pooled_connection_never_reach_the_next_request() -> None:
    """A replica (or a proxy before it) writes a stray response on a kept-alive connection; the next
    request, perhaps another tenant's, gets its own answer on a fresh connection."""
    stray = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 9\r\n\r\n{\"x\": 13}"
    released = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            body = await read_request(r)
            w.write(reply(body))
            await w.drain()
            if not released.is_set():
                await released.wait()
                w.write(stray)
                await w.drain()

    async with server(handler) as (url, accepted):
        pool = UpstreamPool(connect_timeout_s=1)
        first = await pool.post(url, "/a", b'{"n": 1}')
        assert await first.read() == b'{"n": 1}'
        conn = first._conn
        first.release()
        released.set()
        await until(lambda: bool(conn._body) or not conn.reusable())
        second = await pool.post(url, "/a", b'{"n": 2}')
        assert await second.read() == b'{"n": 2}'
        second.release()
        assert len(accepted) == 2
        pool.close()


async def test_bytes_past_a_response_are_dropped_with_the_connection() -> None:
    stray = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nSTRAY"

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            body = await read_request(r)
            w.write(reply(body) + stray)
            await w.drain()

    async with server(handler) as (url, accepted):
        pool = UpstreamPool(connect_timeout_s=1)
        for i in range(2):
            resp = await pool.post(url, "/a", b'{"n": %d}' % i)
            assert await resp.read() == b'{"n": %d}' % i
            resp.release()
        assert len(accepted) == 2
        pool.close()


def one_answer_per_connection() -> Handler:
    """Answers the first request on a connection; closes the connection, unanswered, when a second
    request arrives on it (a server whose keep-alive timer fired just as the request came)."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        body = await read_request(r)
        w.write(reply(body))
        await w.drain()
        await read_head(r)
        w.transport.abort()

    return handler


async def test_two_stale_keep_alive_connections_are_retried_on_a_new_one() -> None:
    async with server(one_answer_per_connection()) as (url, accepted):
        pool = UpstreamPool(connect_timeout_s=1)
        both = await asyncio.gather(*(pool.post(url, "/a", b'{"n": %d}' % i) for i in range(2)))
        for resp in both:
            await resp.read()
            resp.release()
        assert len(accepted) == 2 and len(pool._origins[url].idle) == 2
        resp = await pool.post(url, "/a", b'{"n": 3}')
        assert resp.status == 200 and await resp.read() == b'{"n": 3}'
        resp.release()
        assert len(accepted) == 3  # the second try went to a new connection, not the other stale one
        pool.close()


async def test_a_path_in_the_replica_url_prefixes_every_request() -> None:
    seen: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            head = await read_head(r)
            await r.readexactly(content_length(head))
            seen.append(head.split(b"\r\n", 1)[0])
            w.write(reply(b"{}"))
            await w.drain()

    async with server(handler, path="/vllm/") as (url, _):
        pool = UpstreamPool(connect_timeout_s=1)
        for call in (
            pool.post(url, "/v1/chat/completions", b"{}"),
            pool.get(url, "/metrics?name%5B%5D=x"),
            pool.get(url.rstrip("/"), "/health"),
        ):
            resp = await call
            await resp.read()
            resp.release()
        assert seen == [
            b"POST /vllm/v1/chat/completions HTTP/1.1",
            b"GET /vllm/metrics?name%5B%5D=x HTTP/1.1",
            b"GET /vllm/health HTTP/1.1",
        ]
        pool.close()


async def test_an_untrusted_tls_certificate_is_a_clear_connect_error(tmp_path: Path) -> None:
    made = self_signed(tmp_path)
    if made is None:
        pytest.skip("the openssl command is not installed: no certificate for a TLS test server")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(*made)
    async with server(lambda r, w: r.read(), tls=tls) as (url, _):
        pool = UpstreamPool(connect_timeout_s=2)
        with pytest.raises(ConnectError, match="certificate") as ei:
            await pool.post(url, "/x", b"{}")
        assert not ei.value.timed_out
        pool.close()


async def test_the_first_connect_failure_of_a_kind_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    async with server(lambda r, w: asyncio.sleep(0)) as (url, _):
        pass  # closed: the port now refuses
    pool = UpstreamPool(connect_timeout_s=1)
    with caplog.at_level(logging.DEBUG, logger="gateway.upstream"):
        for _ in range(3):
            with pytest.raises(ConnectError):
                await pool.post(url, "/x", b"{}")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert url in warnings[0].getMessage() and "refused" in warnings[0].getMessage().lower()


async def test_extra_request_headers_go_out_in_the_one_request() -> None:
    heads: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            head = await read_head(r)
            heads.append(head)
            await r.readexactly(content_length(head))
            w.write(reply(b"{}"))
            await w.drain()

    extra = [(b"Authorization", b"Bearer abc"), (b"x-request-id", b"r-1"), (b"x-request-id", b"r-2")]
    async with server(handler) as (url, _):
        pool = UpstreamPool(connect_timeout_s=1)
        for call in (pool.post(url, "/p", b"{}", headers=extra), pool.get(url, "/g", headers=extra)):
            resp = await call
            await resp.read()
            resp.release()
        post, get = heads
        lines = b"Authorization: Bearer abc\r\nx-request-id: r-1\r\nx-request-id: r-2\r\n\r\n"
        assert post.endswith(b"content-length: 2\r\n" + lines)
        assert get.startswith(b"GET /g HTTP/1.1\r\nhost: ") and get.endswith(b"identity\r\n" + lines)
        pool.close()


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ((b"authorization", b"Bearer s3cret\r\nx-evil: 1"), "CR, LF or NUL"),
        ((b"x-id", b"s3cret\nb"), "CR, LF or NUL"),
        ((b"x-id", b"s3cret\rb"), "CR, LF or NUL"),
        ((b"x-id", b"s3cret\0b"), "CR, LF or NUL"),
        ((b"x-id\r\nx-evil", b"1"), "not a token"),
        ((b"x id", b"1"), "not a token"),
        ((b"x-id:", b"1"), "not a token"),
        ((b"", b"1"), "not a token"),
        ((b"Content-Length", b"0"), "own"),
        ((b"host", b"elsewhere"), "own"),
        ((b"transfer-encoding", b"chunked"), "own"),
    ],
)
async def test_request_headers_that_would_change_the_framing_are_refused(
    header: tuple[bytes, bytes], reason: str
) -> None:
    async with server(lambda r, w: r.read()) as (url, accepted):
        pool = UpstreamPool(connect_timeout_s=1)
        with pytest.raises(ValueError, match=reason) as ei:
            await pool.post(url, "/p", b"{}", headers=[(b"x-ok", b"1"), header])
        assert "s3cret" not in str(ei.value)  # a value may be a credential: never in a message
        with pytest.raises(ValueError, match=reason):
            await pool.get(url, "/g", headers=[header])
        assert accepted == []  # refused before anything was sent, or even connected
        pool.close()


async def test_raw_headers_are_the_final_responses_own_in_order() -> None:
    raw = (
        b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nx-request-id: r-1 \r\nset-cookie: b=2\r\n"
        b"transfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-trailer: t\r\n\r\n"
    )

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(raw)
        await w.drain()
        await r.read()

    async with server(handler) as (url, _):
        pool = UpstreamPool(connect_timeout_s=1)
        resp = await pool.post(url, "/p", b"{}")
        assert await resp.read() == b"ok"
        assert resp.raw_headers == [
            (b"Set-Cookie", b"a=1"),
            (b"x-request-id", b"r-1"),
            (b"set-cookie", b"b=2"),
            (b"transfer-encoding", b"chunked"),
        ]
        assert resp.headers["set-cookie"] == "b=2"
        resp.release()
        pool.close()
