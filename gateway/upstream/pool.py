"""Keep-alive connections to the replicas, and the one call the forwarder makes: `UpstreamPool.post`.

Idle connections are kept per replica (most recently used first) and dropped after `idle_s`, below
uvicorn's default keep-alive of 5 s, so kvgate rarely writes into a connection the replica is closing.
When that race is lost anyway — a reused connection ends before any response byte — the request is
sent once more, on a NEW connection (never another idle one, which may be just as stale): the replica
never started on the first. A failure there is the replica's, reported as it is.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gateway.upstream.connection import BrokenError, ConnectError, UpstreamConnection


@dataclass(slots=True)
class _Origin:
    host: str
    port: int
    host_header: bytes
    idle: deque[tuple[UpstreamConnection, float]] = field(default_factory=deque)
    open: int = 0  # connections in use plus idle (for metrics and tests)


class UpstreamResponse:
    """Status, headers and body of one response. Call `release()` (body read to the end: the
    connection goes back to the pool) or `close()` (anything else: the connection is dropped)."""

    __slots__ = ("_conn", "_done", "_origin", "_pool")

    def __init__(self, pool: UpstreamPool, origin: _Origin, conn: UpstreamConnection) -> None:
        self._pool = pool
        self._origin = origin
        self._conn = conn
        self._done = False

    @property
    def status(self) -> int:
        return self._conn.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._conn.headers

    async def read_some(self) -> bytes:
        return await self._conn.read_some()

    async def read(self) -> bytes:
        return await self._conn.read_all()

    def release(self) -> None:
        if not self._done:
            self._done = True
            self._pool._give_back(self._origin, self._conn)

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._conn.abort()
            self._pool._give_back(self._origin, self._conn)


class UpstreamPool:
    """Connections to every replica kvgate talks to. One event loop; `close()` when done."""

    def __init__(self, connect_timeout_s: float, max_idle_per_origin: int = 256, idle_s: float = 4.0) -> None:
        self._connect_timeout = connect_timeout_s
        self._max_idle = max_idle_per_origin
        self._idle_s = idle_s
        self._origins: dict[str, _Origin] = {}

    def _origin(self, base_url: str) -> _Origin:
        o = self._origins.get(base_url)
        if o is None:
            parts = urlsplit(base_url)
            if parts.scheme != "http" or not parts.hostname:
                raise ConnectError(f"unsupported replica URL {base_url!r} (http:// only)")
            port = parts.port or 80
            o = self._origins[base_url] = _Origin(parts.hostname, port, parts.netloc.encode("latin-1"))
        return o

    async def post(self, base_url: str, path: str, body: bytes) -> UpstreamResponse:
        """Send `POST path` with a JSON body and wait for the response's status and headers.

        Raises ConnectError (no connection) or BrokenError (the connection ended before the status
        line). The caller bounds the wait with its own timeout; cancelling closes the connection.
        """
        origin = self._origin(base_url)
        request = (
            b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\naccept: */*\r\n"
            b"content-length: %d\r\n\r\n" % (path.encode("latin-1"), origin.host_header, len(body))
        ) + body
        return await self._send(origin, request)

    async def get(self, base_url: str, path: str) -> UpstreamResponse:
        """Send `GET path` (no body; identity encoding: compressing a page on the replica and inflating
        it here would cost both ends CPU for no gain on a LAN); otherwise as `post`."""
        origin = self._origin(base_url)
        request = b"GET %s HTTP/1.1\r\nhost: %s\r\naccept: */*\r\naccept-encoding: identity\r\n\r\n" % (
            path.encode("latin-1"),
            origin.host_header,
        )
        return await self._send(origin, request)

    async def _send(self, origin: _Origin, request: bytes) -> UpstreamResponse:
        for attempt in (0, 1):
            conn, reused = await self._acquire(origin, fresh=attempt == 1)
            resp = UpstreamResponse(self, origin, conn)
            try:
                conn.start(request)
                await conn.wait_headers()
                return resp
            except BrokenError as err:
                resp.close()
                if reused and not err.got_response:
                    continue  # a keep-alive connection the replica had just closed
                raise
            except BaseException:
                resp.close()
                raise
        raise AssertionError("unreachable")

    async def _acquire(self, o: _Origin, fresh: bool) -> tuple[UpstreamConnection, bool]:
        """(connection, reused): the most recently used idle one that is still good, unless `fresh`,
        else a new one."""
        loop = asyncio.get_running_loop()
        if not fresh:
            now = loop.time()
            while o.idle:
                conn, since = o.idle.pop()
                if not conn.reusable() or now - since > self._idle_s:
                    conn.abort()
                    o.open -= 1
                    continue
                return conn, True
        o.open += 1
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(UpstreamConnection, o.host, o.port)
        except TimeoutError:
            o.open -= 1
            raise ConnectError(f"{o.host}:{o.port}: connect timed out", timed_out=True) from None
        except OSError as err:
            o.open -= 1
            raise ConnectError(f"{o.host}:{o.port}: {err.strerror or err}") from None
        except BaseException:
            o.open -= 1
            raise
        return conn, False

    def _give_back(self, o: _Origin, conn: UpstreamConnection) -> None:
        if conn.reusable() and len(o.idle) < self._max_idle:
            o.idle.append((conn, asyncio.get_running_loop().time()))
        else:
            conn.abort()
            o.open -= 1

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        for o in self._origins.values():
            while o.idle:
                conn, _ = o.idle.pop()
                conn.abort()
            o.open = 0
        self._origins.clear()
