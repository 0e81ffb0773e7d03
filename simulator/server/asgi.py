"""The few raw-ASGI moves the replica's routes need: read a body, answer bytes, reach the transport.

Raw ASGI instead of a framework keeps the per-request cost of the hot routes to what they do; the cold
routes use the same helpers for uniformity.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from simulator.server.errors import ApiError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

TRANSPORT_KEY = "kvgate.transport"
"""Scope extension under which `server.ExposingHttpToolsProtocol` puts the connection's transport."""

JSON = b"application/json"
TEXT = b"text/plain; charset=utf-8"
EVENT_STREAM = b"text/event-stream; charset=utf-8"


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None if the client went away before sending it."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def respond(send: Send, status: int, body: bytes = b"", content_type: bytes | None = JSON) -> None:
    headers = [(b"content-length", b"%d" % len(body))]
    if content_type is not None:
        headers.append((b"content-type", content_type))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def respond_error(send: Send, error: ApiError) -> None:
    await respond(send, error.status, error.body())


def transport_of(scope: Scope) -> asyncio.Transport | None:
    """The connection's transport when served by `ExposingHttpToolsProtocol`, else None."""
    extensions = scope.get("extensions")
    return extensions.get(TRANSPORT_KEY) if extensions else None


async def drop_connection(scope: Scope) -> None:
    """Break the connection abruptly (no clean end of the response): the crash fault."""
    transport = transport_of(scope)
    if transport is not None:
        transport.abort()
    # Let the server see the connection as lost before the handler returns, so it does not log a
    # response left half-written.
    await asyncio.sleep(0)
    await asyncio.sleep(0)
