"""Scripted loopback servers for the upstream client's tests: a handler writes exact bytes.

`server(handler)` serves on 127.0.0.1 (TLS with `tls=`), yields the base URL and a list that grows
by one per accepted connection. `connect(url)` opens one bare `UpstreamConnection` to it.
`self_signed(dir)` makes a certificate for 127.0.0.1 with the openssl command line (None without it).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

from gateway.upstream.connection import UpstreamConnection

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def server(
    handler: Handler, tls: ssl.SSLContext | None = None, path: str = ""
) -> AsyncIterator[tuple[str, list[int]]]:
    """A loopback server; yields its URL (+ `path`) and a list that counts accepted connections.
    On exit it drops every connection still open and waits for the handlers to end."""
    accepted: list[int] = []
    handlers: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []

    async def wrapped(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.append(1)
        writers.append(w)
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            await handler(r, w)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(wrapped, "127.0.0.1", 0, ssl=tls)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}{path}", accepted
    finally:
        srv.close()
        for w in writers:
            w.transport.abort()
        pending = [t for t in handlers if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=2)


async def read_head(r: asyncio.StreamReader) -> bytes:
    """The request head up to and including the blank line."""
    return await r.readuntil(b"\r\n\r\n")


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


async def read_request(r: asyncio.StreamReader) -> bytes:
    """One whole request; returns its body."""
    head = await read_head(r)
    return await r.readexactly(content_length(head))


def reply(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
        % (len(body), extra)
        + body
    )


async def connect(url: str) -> UpstreamConnection:
    parts = urlsplit(url)
    assert parts.hostname and parts.port
    _, conn = await asyncio.get_running_loop().create_connection(
        UpstreamConnection, parts.hostname, parts.port
    )
    return conn


def get(path: str = "/") -> bytes:
    return b"GET %s HTTP/1.1\r\nhost: t\r\n\r\n" % path.encode()


async def until(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    """Poll (bounded) for something the event loop will make true: the client's state changes in
    protocol callbacks that announce nothing, so polling is the way to see it from outside."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.001)


def self_signed(directory: Path) -> tuple[Path, Path] | None:
    """(certificate, key) for CN/SAN 127.0.0.1, self-signed; None when `openssl` is not installed."""
    if shutil.which("openssl") is None:
        return None
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key
