"""The few raw-ASGI moves the proxy hot path needs: read a bounded body, answer, watch for hang-up.

The proxy endpoints skip the web framework's request/response objects: they are on the path of every
request, and the framework's layers cost more than the whole scheduling decision.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from gateway.errors import GatewayError

Scope = dict[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON = (b"content-type", b"application/json")


class ClientGone(Exception):
    """The client hung up before its request body arrived."""


def header(scope: Scope, name: bytes) -> bytes | None:
    """First value of a request header (name in lower case), or None."""
    for k, v in scope["headers"]:
        if k == name:
            return bytes(v)
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body, refusing more than `limit` bytes with 413 before reading them all."""
    declared = header(scope, b"content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise GatewayError(400, "invalid Content-Length header") from None
        if n > limit:
            raise GatewayError(413, f"request body of {n} bytes is over the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientGone
        part = msg.get("body", b"")
        if part:
            size += len(part)
            if size > limit:
                raise GatewayError(413, f"request body is over the limit of {limit} bytes")
            chunks.append(part)
        if not msg.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_bytes(
    send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = (JSON,)
) -> None:
    hdrs = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, err: GatewayError, extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
    await send_bytes(send, err.status, err.body(), (JSON, *err.headers, *extra))


class DisconnectWatch:
    """Cancels `task` when the client hangs up, so every await on the request path stops at once.

    Call `finish()` before the last response message goes out: after that, the server reports
    "disconnect" for a completed response too, and that must not cancel the request's own
    bookkeeping. `gone` tells a cancellation caused by the client from any other.
    """

    __slots__ = ("_task", "_watcher", "finished", "gone")

    def __init__(self, receive: Receive, task: asyncio.Task[Any]) -> None:
        self.gone = False
        self.finished = False
        self._task = task
        self._watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                break
        if not self.finished:
            self.gone = True
            self._task.cancel()

    def finish(self) -> None:
        self.finished = True

    def close(self) -> None:
        self.finished = True
        self._watcher.cancel()
