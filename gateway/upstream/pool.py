"""Keep-alive connections to the replicas, and the calls the forwarder and the scraper make:
`UpstreamPool.post` and `UpstreamPool.get`.

Idle connections are kept per replica (most recently used first) and dropped after `idle_s`, below
uvicorn's default keep-alive of 5 s, so kvgate rarely writes into a connection the replica is closing.
When that race is lost anyway — a reused connection ends before any response byte — the request is
sent once more, on a NEW connection (never another idle one, which may be just as stale): the replica
never started on the first. A failure there is the replica's, reported as it is.

A replica URL may be https:// (TLS, with the pool's `ssl.SSLContext`) and may carry a path prefix
(see `gateway.upstream.address`). The first connect failure of each kind (refused or unreachable,
timed out, TLS) per replica is logged at WARNING with its reason; repeats are DEBUG until a connection
to that replica succeeds again.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gateway.upstream.address import ReplicaAddress, parse_replica_url
from gateway.upstream.connection import BrokenError, ConnectError, UpstreamConnection
from gateway.upstream.tls import client_tls_context

log = logging.getLogger(__name__)

Headers = Sequence[tuple[bytes, bytes]]

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a field name (RFC 9110 §5.1)
_NOT_IN_VALUE = re.compile(rb"[\r\n\0]")
_OWN_HEADERS = frozenset({b"host", b"content-length", b"transfer-encoding"})  # routing and framing


@dataclass(slots=True)
class _Origin:
    url: str  # as configured (never holds credentials: those are refused)
    addr: ReplicaAddress
    tls: ssl.SSLContext | None
    idle: deque[tuple[UpstreamConnection, float]] = field(default_factory=deque)
    open: int = 0  # connections in use plus idle (for metrics and tests)
    warned: set[str] = field(default_factory=set)  # connect failure kinds logged since the last success


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
        """Lower-case names; a repeated name keeps its last value."""
        return self._conn.headers

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """The final response's header lines in order, names as the replica wrote them, values
        without surrounding whitespace; no interim (1xx) response's and no trailers. Do not mutate."""
        return self._conn.raw_headers

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
    """Connections to every replica kvgate talks to. One event loop; `close()` when done.

    `tls` is the context for https:// replicas (`client_tls_context`); None means the default one
    (system CAs, verified), made when the first https:// replica is contacted.
    """

    def __init__(
        self,
        connect_timeout_s: float,
        max_idle_per_origin: int = 256,
        idle_s: float = 4.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._connect_timeout = connect_timeout_s
        self._max_idle = max_idle_per_origin
        self._idle_s = idle_s
        self._tls = tls
        self._origins: dict[str, _Origin] = {}

    def _origin(self, base_url: str) -> _Origin:
        o = self._origins.get(base_url)
        if o is None:
            try:
                addr = parse_replica_url(base_url)
            except ValueError as err:
                raise ConnectError(f"unusable replica URL: it {err}") from None
            tls = None
            if addr.tls:
                if self._tls is None:
                    self._tls = client_tls_context()
                tls = self._tls
            o = self._origins[base_url] = _Origin(base_url, addr, tls)
        return o

    async def post(self, base_url: str, path: str, body: bytes, headers: Headers = ()) -> UpstreamResponse:
        """Send `POST path` with a JSON body and wait for the response's status and headers.

        `path` is the request target (a leading "/", the replica URL's path prefix is put before
        it). `headers` are extra request header lines, written as given after kvgate's own (host,
        content-type, accept, content-length); ValueError if a name is not a token or is host,
        content-length or transfer-encoding, or a value holds CR, LF or NUL (nothing is sent then).

        Raises ConnectError (no connection) or BrokenError (the connection ended before the status
        line). The caller bounds the wait with its own timeout; cancelling closes the connection.
        """
        origin = self._origin(base_url)
        extra = _header_lines(headers) if headers else b""
        request = (
            b"POST %s%s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\naccept: */*\r\n"
            b"accept-encoding: identity\r\n"
            b"content-length: %d\r\n%s\r\n"
            % (origin.addr.path_prefix, path.encode("latin-1"), origin.addr.host_header, len(body), extra)
        ) + body
        return await self._send(origin, request)

    async def get(self, base_url: str, path: str, headers: Headers = ()) -> UpstreamResponse:
        """Send `GET path` (no body; identity encoding: compressing a page on the replica and inflating
        it here would cost both ends CPU for no gain on a LAN); otherwise as `post`."""
        origin = self._origin(base_url)
        extra = _header_lines(headers) if headers else b""
        request = b"GET %s%s HTTP/1.1\r\nhost: %s\r\naccept: */*\r\naccept-encoding: identity\r\n%s\r\n" % (
            origin.addr.path_prefix,
            path.encode("latin-1"),
            origin.addr.host_header,
            extra,
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
        if not fresh:
            now = asyncio.get_running_loop().time()
            while o.idle:
                conn, since = o.idle.pop()
                if not conn.reusable() or now - since > self._idle_s:
                    conn.abort()
                    o.open -= 1
                    continue
                return conn, True
        return await self._connect(o), False

    async def _connect(self, o: _Origin) -> UpstreamConnection:
        a = o.addr
        where = f"{a.host}:{a.port}"
        o.open += 1
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await asyncio.get_running_loop().create_connection(
                    UpstreamConnection, a.host, a.port, ssl=o.tls, server_hostname=a.host if o.tls else None
                )
        except TimeoutError:
            raise self._failed(o, "timeout", ConnectError(f"{where}: connect timed out", True)) from None
        except ssl.SSLCertVerificationError as err:
            why = f"{where}: TLS certificate not accepted: {err.verify_message or err.reason}"
            raise self._failed(o, "tls", ConnectError(why)) from None
        except ssl.SSLError as err:
            raise self._failed(o, "tls", ConnectError(f"{where}: TLS failed: {err.reason or err}")) from None
        except OSError as err:
            refused = isinstance(err, ConnectionRefusedError)
            why = "connection refused" if refused else err.strerror or str(err)
            raise self._failed(o, "connect", ConnectError(f"{where}: {why}")) from None
        except BaseException:
            o.open -= 1
            raise
        if o.warned:
            o.warned.clear()
            log.info("replica %s: connected again", o.url)
        return conn

    def _failed(self, o: _Origin, kind: str, err: ConnectError) -> ConnectError:
        o.open -= 1
        if kind in o.warned:
            log.debug("replica %s: %s", o.url, err)
        else:
            o.warned.add(kind)
            log.warning("replica %s: %s (repeats are logged at DEBUG until a connect succeeds)", o.url, err)
        return err

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


def _header_lines(headers: Headers) -> bytes:
    """`name: value\\r\\n` lines for extra request headers; ValueError for a line that would change
    the request's framing or routing (the value is never quoted: it may be a credential)."""
    lines = []
    for name, value in headers:
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"request header name {name!r} is not a token")
        if name.lower() in _OWN_HEADERS:
            raise ValueError(f"request header {name.decode()!r} is the upstream client's own")
        if _NOT_IN_VALUE.search(value):
            raise ValueError(f"request header {name.decode()!r}: CR, LF or NUL in its value")
        lines.append(b"%s: %s\r\n" % (name, value))
    return b"".join(lines)
