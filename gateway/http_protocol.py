"""kvgate's HTTP/1.1 server protocol: uvicorn's httptools protocol plus what a front door needs.

- TCP_NODELAY on every accepted connection. asyncio only sets it itself when the listening socket was
  created with proto=IPPROTO_TCP, and uvicorn writes a response's headers and body as separate
  segments: without it, Nagle holds the body until the client's delayed ACK, about 40 ms on every
  response (measured here: 52 ms against 4 ms for a non-streaming request through kvgate).
- A bounded time to RECEIVE a request (uvicorn has none: a client sending half its headers, or 9 of
  the 100 bytes it declared, held its connection for as long as it liked). `header_timeout_s` runs
  from the first byte of a request (from the connection's opening, for its first request) to the end
  of the headers; `body_timeout_s` from there to the end of the body, as a whole, so a body that
  trickles one byte a second ends too. Past either, the client gets a 408 (OpenAI's error shape,
  `Connection: close`) if a response can still be written, and the connection is closed; a
  connection that never sent a byte is just closed. Answering is never bounded by these: no timer
  runs while a response on the connection is under way or waiting its turn, so a stream may last as
  long as the replica streams. If kvgate answered before reading the whole body (a 401 before the body
  is read), the rest of the body is discarded as it comes, within what is left of `body_timeout_s`.
- `scope["kvgate.abort"]`: the connection's `transport.abort`, for the app to drop a client that
  stopped reading (gateway/proxy.py).
- A cap on open connections, `max_connections`. A connection accepted past it is answered, at its
  first request's headers, 503 with `Retry-After: 1` and `Connection: close`, and closed. Why answer
  rather than stop accepting: a connection left in the kernel's backlog looks open to the client,
  which sends its request and waits with no signal until its own timeout; a 503 with Retry-After is
  a signal that OpenAI's SDKs and load balancers act on at once (retry later, or elsewhere). A
  refused connection costs an accept, one parsed head and a write, and holds no place under the cap.

Cost on the request path: nothing per chunk of a response; one `call_later` per connection (its
first request's header timer, cancelled when the headers are in), and a timer only for a request
whose headers or body do not arrive with the data that started them. Safe in one event loop, as
every asyncio protocol; `ConnectionCounts` is shared by one server's connections, in that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.config import ServerConfig
from gateway.errors import error_body

_IDLE, _HEADERS, _BODY = 0, 1, 2  # what the connection is waiting for from the client
RETRY_AFTER_S = 1  # connections turn over as streams end: ask again soon


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """Seconds to receive a request's headers and its body; open connections served at once."""

    header_timeout_s: float
    body_timeout_s: float
    max_connections: int

    @classmethod
    def of(cls, server: ServerConfig) -> ClientLimits:
        return cls(server.header_timeout_s, server.body_timeout_s, server.max_connections)


class ConnectionCounts:
    """One server's connection figures, for /metrics. `open` counts connections under the cap."""

    __slots__ = ("body_timeouts", "header_timeouts", "open", "refused")

    def __init__(self) -> None:
        self.open = 0
        self.refused = 0
        self.header_timeouts = 0
        self.body_timeouts = 0

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(
            "kvgate_client_connections", "Client connections open (those under server.max_connections).",
            value=self.open,
        )  # fmt: skip
        yield CounterMetricFamily(
            "kvgate_client_connections_refused",
            "Client connections past server.max_connections, answered 503 and closed.",
            value=self.refused,
        )
        timeouts = CounterMetricFamily(
            "kvgate_client_request_timeouts",
            "Requests whose headers or body did not arrive in time (server.*_timeout_s).",
            labels=["phase"],
        )
        timeouts.add_metric(["headers"], self.header_timeouts)
        timeouts.add_metric(["body"], self.body_timeouts)
        yield timeouts


def _raw_response(status: int, reason: str, message: str) -> bytes:
    """A whole error response, written straight to the transport (no ASGI cycle to go through)."""
    body = error_body(status, message)
    head = [
        f"HTTP/1.1 {status} {reason}".encode(),
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def _timeout_response(part: str, timeout_s: float) -> bytes:
    return _raw_response(408, "Request Timeout", f"the request {part} did not arrive within {timeout_s:g} s")


_DEFAULTS = ClientLimits.of(ServerConfig())
_OVER_CAP_BODY = error_body(
    503,
    "kvgate is serving as many client connections as it is configured for; retry shortly",
    code="too_many_connections",
)
_OVER_CAP_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(_OVER_CAP_BODY)).encode()),
    (b"retry-after", str(RETRY_AFTER_S).encode()),
    (b"connection", b"close"),
]


async def _refuse(scope: Any, receive: Any, send: Any) -> None:
    """The app of a connection past the cap: 503 at once, without reading the request's body."""
    await send({"type": "http.response.start", "status": 503, "headers": _OVER_CAP_HEADERS})
    await send({"type": "http.response.body", "body": _OVER_CAP_BODY, "more_body": False})


class KvgateHttpProtocol(HttpToolsProtocol):
    """One client connection. Use `protocol_class(limits, counts)`: the class attributes below are
    bound per server there. The phase says what the connection waits for from the client; one timer
    at most runs, for the phase it was armed in."""

    limits: ClassVar[ClientLimits] = _DEFAULTS
    counts: ClassVar[ConnectionCounts] = ConnectionCounts()
    header_408: ClassVar[bytes] = _timeout_response("headers", _DEFAULTS.header_timeout_s)
    body_408: ClassVar[bytes] = _timeout_response("body", _DEFAULTS.body_timeout_s)

    _phase: int  # _IDLE, _HEADERS or _BODY
    _admitted: bool  # under the cap: counted in `counts.open`
    _timer: asyncio.TimerHandle | None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)  # type: ignore[arg-type]
        counts = self.counts
        self._phase = _IDLE
        self._admitted = counts.open < self.limits.max_connections
        if self._admitted:
            counts.open += 1
        else:
            counts.refused += 1
            self.app = _refuse
        # Waiting for the first request: bounded like its headers.
        self._timer = self.loop.call_later(self.limits.header_timeout_s, self._expired)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._admitted:
            self._admitted = False
            self.counts.open -= 1
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._phase != _IDLE and self._timer is None:
            self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _HEADERS
        # How the app drops a client that stopped reading: ASGI can only finish a response, and
        # closing the transport gracefully waits for the client to take what is buffered.
        self.scope["kvgate.abort"] = self.transport.abort  # type: ignore[typeddict-unknown-key]

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # A request that arrived while this response was under way gets its timer now.
        if self._phase != _IDLE and self._timer is None:
            self._arm()

    def _busy(self) -> bool:
        """kvgate owes this connection a response (under way, or a pipelined request waiting its
        turn): the client is waiting for kvgate, not the other way round."""
        if self.pipeline:
            return True
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return False
        # Receiving headers: `cycle` is an earlier request, still being answered. Receiving a body:
        # `cycle` is this request, and only a response already started makes kvgate the one owing.
        return self._phase == _HEADERS or cycle.response_started

    def _arm(self) -> None:
        if self.transport.is_closing() or self._busy():
            return
        limits = self.limits
        timeout = limits.header_timeout_s if self._phase == _HEADERS else limits.body_timeout_s
        self._timer = self.loop.call_later(timeout, self._expired)

    def _expired(self) -> None:
        self._timer = None
        transport = self.transport
        if transport.is_closing():
            return
        phase = self._phase
        if phase == _BODY:
            self.counts.body_timeouts += 1
        else:
            self.counts.header_timeouts += 1
        cycle = self.cycle
        if self._busy():
            # An answer is owed or under way (the app answered before the body ended): never cut
            # it; the connection closes when it ends.
            cycle.keep_alive = False
            return
        if phase == _BODY:
            if cycle.response_complete:
                transport.close()  # answered early; the rest of the body is not worth waiting for
                return
            # The app is waiting for a body that is not coming: it sees the client gone, and any
            # response it still tries to send is dropped (uvicorn writes nothing once disconnected).
            cycle.disconnected = True
            cycle.message_event.set()
            transport.write(self.body_408)
        elif phase == _HEADERS:
            transport.write(self.header_408)
        # else: the connection opened and sent nothing; there is no request to answer.
        transport.close()


def protocol_class(limits: ClientLimits, counts: ConnectionCounts) -> type[KvgateHttpProtocol]:
    """The protocol class for one server (uvicorn builds one instance per accepted connection)."""
    attrs = {
        "limits": limits,
        "counts": counts,
        "header_408": _timeout_response("headers", limits.header_timeout_s),
        "body_408": _timeout_response("body", limits.body_timeout_s),
    }
    return type("KvgateHttpProtocol", (KvgateHttpProtocol,), attrs)
