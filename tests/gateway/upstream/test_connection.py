"""UpstreamConnection against scripted loopback servers writing exact bytes: framing (CRLF, chunk
extensions, trailers, close-delimited bodies, bodiless statuses), interim 1xx responses, responses
split at every byte boundary, stalls, malformed answers, early answers, keep-alive rules, stray bytes
on an idle connection, and flow control."""

from __future__ import annotations

import asyncio

import pytest

from gateway.upstream import BrokenError
from gateway.upstream.connection import HIGH_WATER, UpstreamConnection
from tests.gateway.upstream.scripted import (
    connect,
    content_length,
    get,
    read_head,
    read_request,
    reply,
    server,
    until,
)

WAIT = 2.0  # generous bound on any single wait; every test finishes well within a few seconds


async def exchange(conn: UpstreamConnection, request: bytes | None = None) -> tuple[int, bytes]:
    """Send `request` (a GET by default) and read the whole response: (status, body)."""
    async with asyncio.timeout(WAIT):
        conn.start(request or get())
        await conn.wait_headers()
        return conn.status, await conn.read_all()


def answer_with(*responses: bytes, keep_open: bool = True):  # type: ignore[no-untyped-def]
    """A handler answering the i-th request on a connection with `responses[i]`, exactly."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        for data in responses:
            await read_request(r)
            w.write(data)
            await w.drain()
        if keep_open:
            await r.read()

    return handler


# -- framing ------------------------------------------------------------------------------------------


async def test_crlf_framing_and_a_body_full_of_crlf_pass_through_exactly() -> None:
    body = b"\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n\r\n"  # looks like framing; it is only body bytes
    raw = b"HTTP/1.1 200 OK\r\nX-Custom:  spaced value \r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    async with server(answer_with(raw)) as (url, _):
        conn = await connect(url)
        assert await exchange(conn) == (200, body)
        assert conn.headers["x-custom"] == "spaced value"
        assert conn.reusable()
        conn.abort()


async def test_chunk_extensions_and_trailers() -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n"
        b"5;name=value\r\nhello\r\n"
        b'6;a;b="c d"\r\n world\r\n'
        b"0;last\r\nx-checksum: 42\r\n\r\n"
    )
    async with server(answer_with(raw, reply(b"next"))) as (url, accepted):
        conn = await connect(url)
        assert await exchange(conn) == (200, b"hello world")
        assert "x-checksum" not in conn.headers  # a trailer is not a header of the response
        assert conn.reusable()
        assert await exchange(conn) == (200, b"next")  # the trailer left nothing behind
        assert len(accepted) == 1
        conn.abort()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_response_split_at_every_byte_boundary(chunked: bool) -> None:
    """For every k, the client reads the first k bytes in one read and the rest in another; one
    keep-alive connection serves them all, so each response must also end exactly where it ends."""
    if chunked:
        raw = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            b"7\r\ndata: 1\r\n4;x=y\r\n\n\n\n\n\r\n0\r\nt: v\r\n\r\n"
        )
        body = b"data: 1\n\n\n\n"
    else:
        body = b'{"a": "b\\r\\n"}'
        raw = reply(body, b"x-h: v\r\n")
    may_finish = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        for k in range(1, len(raw)):
            await read_request(r)
            w.write(raw[:k])
            await w.drain()
            await may_finish.wait()
            may_finish.clear()
            w.write(raw[k:])
            await w.drain()
        await r.read()

    async with server(handler) as (url, accepted):
        conn = await connect(url)
        for k in range(1, len(raw)):
            conn.start(get())
            await until(lambda: conn.got_response)  # the first k bytes are in
            may_finish.set()
            async with asyncio.timeout(WAIT):
                await conn.wait_headers()
                assert (conn.status, await conn.read_all()) == (200, body), k
            assert conn.reusable(), k
        assert len(accepted) == 1
        conn.abort()


async def test_a_stream_that_stalls_after_some_chunks_resumes() -> None:
    go_on = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\na1\r\n2\r\na2\r\n")
        await w.drain()
        await go_on.wait()
        w.write(b"2\r\nb3\r\n0\r\n\r\n")
        await w.drain()
        await r.read()

    async with server(handler) as (url, _):
        conn = await connect(url)
        conn.start(get())
        got = b""
        async with asyncio.timeout(WAIT):
            await conn.wait_headers()
            while got != b"a1a2":
                got += await conn.read_some()
        waiting = asyncio.create_task(conn.read_some())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # stalled: waits, neither ends nor fails
        go_on.set()
        async with asyncio.timeout(WAIT):
            assert await waiting == b"b3"
            assert await conn.read_some() == b""
        assert conn.reusable()
        conn.abort()


# -- interim responses ----------------------------------------------------------------------------


@pytest.mark.parametrize("split", [False, True], ids=["one-write", "separate-writes"])
async def test_interim_1xx_responses_are_skipped(split: bool) -> None:
    parts = [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\nok",
    ]

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        for _ in range(2):
            await read_request(r)
            for part in parts if split else [b"".join(parts)]:
                w.write(part)
                await w.drain()
                await asyncio.sleep(0.01)
        await r.read()

    async with server(handler) as (url, accepted):
        conn = await connect(url)
        for _ in range(2):  # and the connection is reusable afterwards
            assert await exchange(conn) == (200, b"ok")
            assert conn.headers == {"content-type": "application/json", "content-length": "2"}
            assert conn.raw_headers == [(b"content-type", b"application/json"), (b"content-length", b"2")]
            assert conn.reusable()
        assert len(accepted) == 1
        conn.abort()


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    ],
    ids=["with-upgrade", "bare"],
)
async def test_101_switching_protocols_is_a_broken_answer(raw: bytes) -> None:
    async with server(answer_with(raw)) as (url, _):
        conn = await connect(url)
        with pytest.raises(BrokenError, match="101") as ei:
            await exchange(conn)
        assert ei.value.got_response
        assert not conn.reusable()


# -- where a body ends ----------------------------------------------------------------------------


async def test_a_close_delimited_event_stream_with_stalls_ends_normally() -> None:
    events = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
    taken = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        for event in events:
            w.write(event)
            await w.drain()
            await taken.wait()  # a stall until the client has read this one
            taken.clear()
        # returning closes the connection: that is where the body ends

    async with server(handler) as (url, _):
        conn = await connect(url)
        conn.start(get())
        async with asyncio.timeout(WAIT):
            await conn.wait_headers()
            assert conn.status == 200
            got = []
            while data := await conn.read_some():
                got.append(data)
                if b"".join(got) in {b"".join(events[:i]) for i in range(1, 4)}:
                    taken.set()
        assert b"".join(got) == b"".join(events)
        assert conn.complete and not conn.reusable()


async def test_an_http_1_0_body_without_length_ends_at_the_close() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nhello ")
        await w.drain()
        await asyncio.sleep(0.01)
        w.write(b"world")
        await w.drain()

    async with server(handler) as (url, _):
        conn = await connect(url)
        assert await exchange(conn) == (200, b"hello world")
        assert not conn.reusable()


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 10\r\n\r\nhello",
    ],
    ids=["chunked", "content-length", "content-length-close"],
)
async def test_a_framed_body_cut_short_by_a_close_is_broken(raw: bytes) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(raw)
        await w.drain()

    async with server(handler) as (url, _):
        conn = await connect(url)
        with pytest.raises(BrokenError, match="closed") as ei:
            await exchange(conn)
        assert ei.value.got_response and not conn.reusable()


@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
async def test_bodiless_statuses_never_wait_for_a_body(status: bytes) -> None:
    raw = b"HTTP/1.1 %s\r\netag: x\r\n\r\n" % status
    async with server(answer_with(raw, reply(b"after"))) as (url, _):
        conn = await connect(url)
        conn.start(get())
        async with asyncio.timeout(0.3):  # the server keeps the connection open: nothing to wait for
            await conn.wait_headers()
            assert await conn.read_all() == b""
        assert conn.reusable()
        assert await exchange(conn) == (200, b"after")
        conn.abort()


# -- broken, early and closing answers ------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b"HTTP/1.1 2OO OK\r\n\r\n", b"HTTP/1.1200 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n"],
)
async def test_a_malformed_answer_is_broken_and_not_reusable(raw: bytes) -> None:
    async with server(answer_with(raw)) as (url, _):
        conn = await connect(url)
        with pytest.raises(BrokenError, match="malformed") as ei:
            await exchange(conn)
        assert ei.value.got_response and not conn.reusable()


async def test_an_answer_before_the_whole_request_body_was_read() -> None:
    """A server may answer from the head alone (here a 413) while the body is still coming. The
    client takes the answer at once, and reuses the connection only once its request is all sent."""
    body = b"x" * (48 << 20)  # more than the loopback socket buffers hold, so the write is unfinished
    read_rest = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = await read_head(r)
        w.write(b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 8\r\n\r\ntoo big!")
        await w.drain()
        await read_rest.wait()
        await r.readexactly(content_length(head))  # then it takes the rest, keeping the connection
        await read_request(r)
        w.write(reply(b"next"))
        await w.drain()
        await r.read()

    async with server(handler) as (url, accepted):
        conn = await connect(url)
        request = b"POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n" % len(body)
        assert await exchange(conn, request + body) == (413, b"too big!")
        assert conn.transport is not None and conn.transport.get_write_buffer_size() > 0
        assert not conn.reusable()  # the request is not all sent yet
        read_rest.set()
        await until(conn.reusable)
        assert await exchange(conn) == (200, b"next")
        assert len(accepted) == 1
        conn.abort()


async def test_reusable_only_once_the_response_was_read_to_its_end() -> None:
    async with server(answer_with(reply(b"0123456789"))) as (url, _):
        conn = await connect(url)
        conn.start(get())
        async with asyncio.timeout(WAIT):
            await conn.wait_headers()
            assert not conn.reusable()
            await until(lambda: conn.complete)
            assert not conn.reusable()  # complete, but the body is still unread
            assert await conn.read_all() == b"0123456789"
        assert conn.reusable()
        conn.abort()


@pytest.mark.parametrize("close", [b"connection: close\r\n", b"Connection: Close\r\n"])
async def test_connection_close_is_not_reused(close: bytes) -> None:
    async with server(answer_with(reply(b"ok", close))) as (url, _):
        conn = await connect(url)
        assert await exchange(conn) == (200, b"ok")
        assert not conn.reusable()
        conn.abort()


# -- stray bytes ------------------------------------------------------------------------------------


async def test_bytes_on_an_idle_connection_poison_it() -> None:
    sent = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(reply(b"ok"))
        await w.drain()
        await sent.wait()
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nSTRAY")
        await w.drain()
        await r.read()

    async with server(handler) as (url, _):
        conn = await connect(url)
        assert await exchange(conn) == (200, b"ok")
        assert conn.reusable()
        sent.set()
        await until(lambda: bool(conn._body) or not conn.reusable())
        assert not conn.reusable() and not conn._body
        with pytest.raises(BrokenError):
            conn.start(get())  # never starts on a poisoned connection


async def test_bytes_past_the_end_of_a_response_are_never_delivered() -> None:
    stray = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nSTRAY"
    async with server(answer_with(reply(b"ok") + stray)) as (url, _):
        conn = await connect(url)
        assert await exchange(conn) == (200, b"ok")
        assert not conn.reusable()


# -- flow control -----------------------------------------------------------------------------------


async def test_reading_pauses_above_high_water_and_resumes_once_read() -> None:
    size = 4 * HIGH_WATER
    async with server(answer_with(reply(b"y" * size))) as (url, _):
        conn = await connect(url)
        conn.start(get())
        async with asyncio.timeout(WAIT):
            await conn.wait_headers()
            await until(lambda: conn._paused)
        await asyncio.sleep(0.05)  # the server keeps pushing; the client holds at about HIGH_WATER
        assert conn._paused and conn._buffered < 2 * HIGH_WATER
        async with asyncio.timeout(WAIT):
            first = await conn.read_some()
            assert not conn._paused  # resumed by the read
            assert len(first) + len(await conn.read_all()) == size
        assert conn.reusable()
        conn.abort()
