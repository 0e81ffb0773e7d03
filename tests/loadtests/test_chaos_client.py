"""The chaos benchmark's client classifies each ending correctly: scripted servers write exact bytes."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import orjson
import pytest

from loadtests.chaos_client import Bounds, Plan, plan_request, send

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
BOUNDS = Bounds(first_byte_bound_s=0.5, chunk_bound_s=0.3, unary_bound_s=0.5)
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


TOKEN = event({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
DONE = b"data: [DONE]\n\n"
ERROR = event({"error": {"message": "the replica stopped answering mid-stream", "code": 502}})


async def _read_request(r: asyncio.StreamReader) -> None:
    head = await r.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    await r.readexactly(length)


@contextlib.asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[str]:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await _read_request(r)
            await script(r, w)
        w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/v1/chat/completions"
    finally:
        srv.close()


async def run(script: Script, plan: Plan) -> tuple[str, str]:
    async with scripted(script) as url, aiohttp.ClientSession() as session:
        out = await send(session, url, plan, BOUNDS)
    return out.kind, out.detail


STREAM = Plan("k", b"{}", stream=True)
UNARY = Plan("k", b"{}", stream=False)


def stream_of(*events: bytes, end: bool = True, stall: float = 0.0) -> Script:
    async def script(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(SSE_HEAD)
        for e in events:
            w.write(chunk(e))
            await w.drain()
        if stall:
            await asyncio.sleep(stall)
        if end:
            w.write(b"0\r\n\r\n")
            await w.drain()

    return script


def whole(status: int, body: bytes) -> Script:
    async def script(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
            status, len(body), body))  # fmt: skip
        await w.drain()

    return script


async def test_a_stream_that_ends_with_done_is_ok() -> None:
    assert (await run(stream_of(TOKEN, TOKEN, DONE), STREAM))[0] == "ok"


async def test_an_error_event_followed_by_done_is_the_documented_ending() -> None:
    kind, detail = await run(stream_of(TOKEN, ERROR + DONE), STREAM)
    assert kind == "stream_error" and "mid-stream" in detail


async def test_an_error_event_without_done_is_incomplete() -> None:
    assert (await run(stream_of(TOKEN, ERROR), STREAM))[0] == "incomplete"


async def test_a_stream_that_ends_without_done_is_incomplete() -> None:
    assert (await run(stream_of(TOKEN, TOKEN), STREAM))[0] == "incomplete"


async def test_a_stalled_stream_is_hung() -> None:
    kind, detail = await run(stream_of(TOKEN, end=False, stall=2.0), STREAM)
    assert kind == "hung" and "stalled" in detail


async def test_no_answer_at_all_is_hung() -> None:
    async def silent(_: asyncio.StreamReader, __: asyncio.StreamWriter) -> None:
        await asyncio.sleep(2.0)

    assert (await run(silent, STREAM))[0] == "hung"


async def test_a_connection_cut_mid_body_is_broken() -> None:
    async def cut(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(SSE_HEAD + chunk(TOKEN) + b"ff\r\npartial")
        await w.drain()
        w.transport.abort()

    assert (await run(cut, STREAM))[0] == "broken"


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (200, orjson.dumps({"choices": [{"message": {"content": "x"}}]}), "ok"),
        (429, orjson.dumps({"error": {"message": "Rate limit reached", "code": 429}}), "http_error"),
        (503, orjson.dumps({"error": {"message": "fleet overloaded", "code": 503}}), "http_error"),
        (500, orjson.dumps({"error": {"message": "internal error in kvgate", "code": 500}}), "kvgate_500"),
        (500, orjson.dumps({"object": "error", "message": "engine died", "code": 500}), "http_error"),
        (502, b"<html>bad gateway</html>", "broken"),
    ],
)
async def test_whole_answers(status: int, body: bytes, kind: str) -> None:
    assert (await run(whole(status, body), UNARY))[0] == kind


async def test_a_client_that_hangs_up_mid_stream_is_counted_as_such() -> None:
    plan = Plan("k", b"{}", stream=True, abort_after_chunks=1)
    assert (await run(stream_of(TOKEN, TOKEN, TOKEN, DONE, stall=1.0), plan))[0] == "client_abort"


def test_planned_requests_are_valid_chat_requests_and_sometimes_hang_up() -> None:
    rng = random.Random(3)
    plans = [plan_request(rng, ["a", "b"], "m", ["p1", "p2"], abort_share=0.2) for _ in range(500)]
    bodies = [orjson.loads(p.body) for p in plans]
    assert all(b["model"] == "m" and b["messages"][0]["content"] in ("p1", "p2") for b in bodies)
    assert all(
        16 <= b["max_tokens"] <= 96 and b["stream"] == p.stream for b, p in zip(bodies, plans, strict=True)
    )
    aborts = [p for p in plans if p.abort_after_chunks is not None]
    assert 50 < len(aborts) < 150
    assert all(p.abort_after_chunks == 0 for p in aborts if not p.stream)
    assert {p.tenant_key for p in plans} == {"a", "b"}


async def test_a_refusal_s_retry_after_is_kept_for_the_client_to_wait() -> None:
    body = orjson.dumps({"error": {"message": "Rate limit reached", "code": 429}})

    async def refuse(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 429 X\r\nretry-after: 7\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await w.drain()

    async with scripted(refuse) as url, aiohttp.ClientSession() as session:
        out = await send(session, url, UNARY, BOUNDS)
    assert (out.kind, out.status, out.retry_after_s) == ("http_error", 429, 7.0)
