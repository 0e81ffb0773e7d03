"""Scripted replicas: loopback servers that write exact bytes, for the forwarder's edge cases.

A handler gets the accepted connection's reader and writer and the server's `Scripted` record, and
plays one replica's side of the conversation byte for byte. `Scripted.eof` is set once kvgate closed
(or aborted) the connection while the handler was reading: how a test sees a request cancelled
upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tests.vllm_fixtures import VLLM_FIXTURES

_PAGES = {
    b"/metrics": (b"text/plain; version=0.0.4", (VLLM_FIXTURES / "metrics.txt").read_bytes()),
    b"/v1/models": (b"application/json", (VLLM_FIXTURES / "models_with_adapters.json").read_bytes()),
    b"/health": (b"application/json", b""),
}
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Scripted"], Awaitable[None]]

SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
# No length and no chunking: the body ends when the replica closes the connection (RFC 9112 6.3).
SSE_HEAD_CLOSE_DELIMITED = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"


@dataclass
class Scripted:
    url: str
    accepted: int = 0
    requests: list[bytes] = field(default_factory=list)  # request bodies, in arrival order
    heads: list[bytes] = field(default_factory=list)  # POST request heads (serves_vllm), in order
    eof: asyncio.Event = field(default_factory=asyncio.Event)


@contextlib.asynccontextmanager
async def scripted(handler: Handler) -> AsyncIterator[Scripted]:
    """A loopback server running `handler` for each connection; yields what it saw."""
    state = Scripted("")
    running: set[asyncio.Task[Any]] = set()

    async def wrapped(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        state.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        running.add(task)
        try:
            await handler(r, w, state)
        except (ConnectionError, asyncio.IncompleteReadError):
            state.eof.set()
        except asyncio.CancelledError:
            pass  # the test is over (see below); a cancelled handler task would be logged as an error
        finally:
            running.discard(task)
            w.close()

    srv = await asyncio.start_server(wrapped, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    try:
        yield state
    finally:
        srv.close()
        for task in list(running):  # a handler still playing its part (e.g. a stalled replica)
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


async def read_any(r: asyncio.StreamReader) -> tuple[bytes, bytes, bytes, bytes]:
    """One request: (method, path, body, head); the body Content-Length framed, as kvgate sends
    them."""
    head = await r.readuntil(b"\r\n\r\n")
    method, path, _ = head.split(b" ", 2)
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return method, path, await r.readexactly(length), head


async def read_request(r: asyncio.StreamReader, state: Scripted | None = None) -> bytes:
    """One request's body, recorded in `state.requests`."""
    _, _, body, _ = await read_any(r)
    if state is not None:
        state.requests.append(body)
    return body


def serves_vllm(post: Handler) -> Handler:
    """A replica kvgate can route to: its scrapes (`/metrics`, `/health`, `/v1/models`) answered from
    the captured vLLM pages, and each POST (recorded in `state.requests`) played by `post`, which
    takes over the connection."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        while True:
            method, path, body, head = await read_any(r)
            if method == b"POST":
                state.requests.append(body)
                state.heads.append(head)
                await post(r, w, state)
                return
            page = _PAGES.get(path.split(b"?", 1)[0])
            w.write(unary(b"", 404, b"Not Found") if page is None else unary(page[1], content_type=page[0]))
            await w.drain()

    return handler


async def until_closed(r: asyncio.StreamReader, state: Scripted) -> None:
    """Read until kvgate closes the connection, then set `state.eof` (a reset counts as closed)."""
    try:
        while await r.read(65536):
            pass
    except ConnectionError:
        pass
    state.eof.set()


def unary(
    body: bytes, status: int = 200, reason: bytes = b"OK", content_type: bytes = b"application/json"
) -> bytes:
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
        % (status, reason, content_type, len(body))
    ) + body


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(payload: bytes, end: bytes = b"\n\n") -> bytes:
    """One SSE `data:` event framed by `end`."""
    return b"data: " + payload + end
