"""Send one request to the best replica, fail over before the first byte, relay the answer untouched.

Failover happens on a connect error, a timeout before the first byte, a 502/503 from the replica, or
(non-streaming) a connection that breaks before the whole answer arrived — always before anything has
gone to the client. Once the first byte is out, a broken stream ends with an SSE error event and
`data: [DONE]`, never a hang. Other replica statuses and error bodies pass through unchanged. A stream
that delivered `data: [DONE]` is whole, however the connection ends after it.

Whose fault a timeout is decides what follows. Waits on the replica are bounded by `Timeouts`'
connect, first-byte, chunk and response windows: one running out is the replica's failure (reported
to the fleet, which may eject it). Waits on the client — its socket taking what kvgate sends — are
bounded by `send_s`: one running out is the client's doing (`Outcome.slow_client`): the upstream
request is closed, nothing is reported against the replica, and the client's connection is left
unfinished for the server to close.

Closing the upstream response is how a request is cancelled: vLLM aborts it and frees its KV blocks.

What goes to the replica besides the body: the replica's credential (`ReplicaCredentials`, never the
client's key) and the request's `x-request-id`. What comes back: the replica's status, body and its
response headers except hop-by-hop ones, framing (kvgate frames the answer itself), `date`/`server`,
the request id (kvgate sets its own) and anything named `x-kvgate-*` (kvgate's to say).

Replicas come and go while requests run. A ranked replica that is no longer routable when its turn
comes (drained, not ready, gone since the decision) is skipped without an attempt. An attempt still
waiting for its first byte when its replica leaves the fleet (`replica_departed`) is given up at once
and the request goes to the next candidate, without counting against the retries or the replica; an
answer already streaming finishes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.replica_auth import ReplicaCredentials
from gateway.sse_filter import SseFilter, Usage, usage_from
from gateway.stall_watch import StallWatch
from gateway.upstream import BrokenError, ConnectError, UpstreamPool, UpstreamResponse
from policies.types import ReplicaState

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_SSE_HEADERS = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
)
_SSE_NAMES = frozenset(name for name, _ in _SSE_HEADERS)
_DONE = b"data: [DONE]\n\n"
_RETRY_STATUSES = frozenset({502, 503})
Header = tuple[bytes, bytes]
# Replica response headers kvgate does not pass on (lower case): hop-by-hop (RFC 9110 7.6.1), framing
# and content type (kvgate frames and types the answer it sends), what the server adds itself.
_NOT_PASSED = frozenset(
    {
        b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer",
        b"upgrade", b"proxy-authenticate", b"proxy-authorization", b"content-length", b"content-type",
        b"date", b"server", b"x-request-id",
    }
)  # fmt: skip
DEPARTED = "replica_gone"  # error kind of an attempt given up because its replica left the fleet


@dataclass(slots=True, eq=False)  # compared and hashed by identity: one per attempt
class _Waiting:
    """One attempt waiting for its first byte: its timeout, expired early if its replica leaves."""

    timeout: asyncio.Timeout | None = None
    departed: bool = False


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds, each a delay from the start of the wait it bounds."""

    connect_s: float
    first_byte_s: float  # streaming: until the first chunk; covers replica queueing and prefill
    chunk_s: float  # streaming: between two chunks from the replica
    response_s: float  # non-streaming: until the whole answer has arrived from the replica
    send_s: float  # one send to the client: how long its socket may take nothing (server.send_timeout_s)


@dataclass(slots=True)
class Outcome:
    """What happened to one request on its way through the forwarder."""

    status: int = 0  # status sent to the client (0 = nothing sent)
    replica: str | None = None
    usage: Usage | None = None
    events: int = 0  # SSE events relayed
    dispatched_at: float | None = None  # perf_counter when the first attempt went out
    first_byte_at: float | None = None  # perf_counter when the first byte went to the client
    ended_at: float | None = None
    error_kind: str | None = None  # connect, connect_timeout, timeout, status_5xx, stream_broken, ...
    error_detail: str = ""  # what the last failed attempt said, for the client's error message
    attempts: int = 0
    slow_client: bool = False  # kvgate gave up on a client that took nothing for send_s (its doing)
    # The latency model's word on the last attempt (gateway/latency_store.py): its predicted time from
    # dispatch to first chunk, and |predicted - actual| / actual when a stream's first chunk came and
    # the prediction's inputs were fresh (None otherwise).
    predicted_ttft_s: float | None = None
    ttft_error: float | None = None


@dataclass(slots=True)
class Dispatch:
    """One request ready to go: body bytes, ranked replicas, and hooks into fleet accounting."""

    path: str
    body: bytes
    ranked: Sequence[ReplicaState]
    stream: bool
    strip_usage: bool
    response_headers: list[tuple[bytes, bytes]]
    on_attempt: Callable[[ReplicaState], None]  # called before each try (in-flight +1, index record)
    on_attempt_end: Callable[[ReplicaState], None]  # after each try, whatever happened
    # Each gap between two stream chunks relayed to the client, in seconds, as the stream goes
    # (the model's inter-chunk latency histogram): n chunks relayed, n - 1 calls.
    observe_itl: Callable[[float], None] = lambda _gap: None
    # Called once per attempt when its first chunk goes to the client (streams only): the latency
    # model's TTFT observation (gateway/latency_store.py).
    on_first_chunk: Callable[[ReplicaState], None] = lambda _replica: None
    upstream_headers: tuple[Header, ...] = ()  # sent to every replica tried (x-request-id)
    # A fresh ranking (the fleet changed): asked when an attempt's replica left the fleet before its
    # first byte, so the request goes where the scheduler would send it now. None: the rest of `ranked`.
    rerank: Callable[[], Sequence[ReplicaState]] | None = None
    # (the replica's `"model":<name>` bytes, the client's) when the client named the model otherwise
    # (a route, an adapter's canonical name): replaced in the answer as bytes; None costs nothing.
    rewrite: tuple[bytes, bytes] | None = None


class Forwarder:
    """Owns nothing but a reference to the shared upstream pool; safe for concurrent use from one
    event loop."""

    def __init__(
        self,
        pool: UpstreamPool,
        timeouts: Timeouts,
        max_retries: int,
        metrics: GatewayMetrics,
        report_failure: Callable[[str, str], None],
        credentials: ReplicaCredentials | None = None,
        routable: Callable[[str], bool] = lambda _name: True,
    ) -> None:
        self._pool = pool
        self._t = timeouts
        self._max_retries = max_retries
        self._metrics = metrics
        self._report_failure = report_failure
        self._credentials = credentials or ReplicaCredentials({}, {})
        self._routable = routable  # may a new attempt go to this replica now (FleetState.routable)
        self._waiting: dict[str, set[_Waiting]] = {}  # replica -> attempts awaiting their first byte

    def replica_departed(self, replica: str) -> None:
        """`replica` left the fleet: attempts still waiting for its first byte go elsewhere now."""
        for waiting in self._waiting.pop(replica, ()):
            waiting.departed = True
            if waiting.timeout is not None and not waiting.timeout.expired():
                waiting.timeout.reschedule(asyncio.get_running_loop().time())

    async def forward(self, d: Dispatch, send: Send, out: Outcome | None = None) -> Outcome:
        """Forward `d`; `out` (optional) is filled as the request goes, so a caller whose task is
        cancelled (client gone) still knows how far it got (status, events relayed, usage)."""
        out = out if out is not None else Outcome()
        routable = self._routable
        remaining = [r for r in d.ranked if routable(r.name)]
        if not remaining:
            raise GatewayError(503, "no replica can serve this request right now")
        budget = 1 + self._max_retries  # attempts left; one given up for a departed replica is free
        last_error: GatewayError | None = None
        attempts = 0
        while remaining and budget > 0:
            replica = remaining.pop(0)
            if attempts and not routable(replica.name):
                continue  # it left, or was drained, while an earlier attempt ran
            last = budget == 1 or not remaining
            attempts += 1
            out.attempts = attempts
            if out.dispatched_at is None:
                out.dispatched_at = time.perf_counter()
            out.replica = replica.name
            out.error_kind = None
            out.error_detail = ""
            d.on_attempt(replica)
            try:
                done = await self._try_one(d, replica, send, out, last)
            finally:
                d.on_attempt_end(replica)
            if done:
                return out
            assert out.error_kind is not None
            if out.error_kind == DEPARTED:
                self._metrics.retries.labels(DEPARTED).inc()
                last_error = GatewayError(503, "the replica left the fleet before answering")
                if d.rerank is not None:
                    remaining = [r for r in d.rerank() if r.name != replica.name and routable(r.name)]
                continue
            budget -= 1
            self._metrics.upstream_errors.labels(replica.name, out.error_kind).inc()
            self._report_failure(replica.name, out.error_kind)
            if not last:
                self._metrics.retries.labels(out.error_kind).inc()
            last_error = _final_error(out.error_kind, out.error_detail)
        if last_error is None:
            raise GatewayError(503, "no replica can serve this request right now")
        raise last_error

    async def _try_one(
        self, d: Dispatch, replica: ReplicaState, send: Send, out: Outcome, last: bool
    ) -> bool:
        """One attempt. True when the client got its answer (or an error it must see, or kvgate gave
        up on the client); False to retry, only ever before anything was sent to the client. The
        replica's timeout covers only waiting on the replica: sending is bounded on its own."""
        timeout_s = self._t.first_byte_s if d.stream else self._t.response_s
        resp: UpstreamResponse | None = None
        whole: bytes | None = None
        first = b""
        headers = self._credentials.headers_for(replica.name, replica.pool) + d.upstream_headers
        waiting = _Waiting()
        waiters = self._waiting.setdefault(replica.name, set())
        waiters.add(waiting)
        try:
            async with asyncio.timeout(timeout_s) as waiting.timeout:
                resp = await self._pool.post(replica.url, d.path, d.body, headers)
                if resp.status in _RETRY_STATUSES and not last:
                    resp.close()
                    out.error_kind = "status_5xx"
                    return False
                if resp.status != 200 or not d.stream:
                    whole = await resp.read()
                    resp.release()
                else:
                    first = await resp.read_some()
        except TimeoutError:
            if resp is not None:
                resp.close()
            out.error_kind = DEPARTED if waiting.departed else "timeout"
            return False
        except ConnectError as err:
            # Refused: the replica is gone (ejected at once). Timed out: maybe only a busy moment,
            # so it counts towards ejection like any other failure.
            out.error_kind = "connect_timeout" if err.timed_out else "connect"
            out.error_detail = str(err)
            return False
        except BrokenError as err:
            if resp is not None:
                resp.close()
            # Never "connect", even before any response byte: the pool already retried a stale
            # kept-alive connection on a new one, so this replica accepted a connection and then
            # dropped it. A real failure (counts toward ejection), not a refused connect (ejects).
            out.error_kind = "broken"
            out.error_detail = str(err)
            return False
        except BaseException:
            if resp is not None:
                resp.close()  # cancelled (client gone): closing aborts the request on the replica
            raise
        finally:
            waiters.discard(waiting)
            if not waiters and self._waiting.get(replica.name) is waiters:
                del self._waiting[replica.name]
        assert resp is not None
        if whole is not None:
            await self._send_whole(d, replica, resp, whole, send, out)
            return True
        try:
            await self._relay(d, replica, resp, first, send, out)
        finally:
            resp.close()  # a no-op once released
        return True

    async def _send_whole(
        self,
        d: Dispatch,
        replica: ReplicaState,
        resp: UpstreamResponse,
        body: bytes,
        send: Send,
        out: Outcome,
    ) -> None:
        if resp.status == 200:
            try:
                out.usage = usage_from(orjson.loads(body))
            except orjson.JSONDecodeError:
                out.usage = None
            if d.rewrite is not None:
                body = body.replace(*d.rewrite)
        headers = [
            (b"content-type", resp.headers.get("content-type", "application/json").encode("latin-1")),
            (b"content-length", b"%d" % len(body)),
            *_passed_on(resp.raw_headers),
            (b"x-kvgate-replica", replica.name.encode()),
            *d.response_headers,
        ]
        try:
            async with asyncio.timeout(self._t.send_s):
                await send({"type": "http.response.start", "status": resp.status, "headers": headers})
                out.status = resp.status
                out.first_byte_at = time.perf_counter()
                await send({"type": "http.response.body", "body": body, "more_body": False})
        except TimeoutError:
            self._gave_up_on_client(out)
            return
        out.ended_at = time.perf_counter()

    async def _relay(
        self,
        d: Dispatch,
        replica: ReplicaState,
        resp: UpstreamResponse,
        first: bytes,
        send: Send,
        out: Outcome,
    ) -> None:
        """Stream the answer as it comes. Each wait for the replica is bounded by chunk_s, each wait
        for the client by send_s (one `StallWatch`: no per-chunk timer work)."""
        headers = [
            *_SSE_HEADERS,
            *_passed_on(resp.raw_headers, _SSE_NAMES),
            (b"x-kvgate-replica", replica.name.encode()),
            *d.response_headers,
        ]
        filt = SseFilter(strip_usage=d.strip_usage)
        feed = filt.feed if d.rewrite is None else _rewriting(filt.feed, *d.rewrite)
        observe_itl = d.observe_itl
        clock = time.perf_counter
        last = 0.0  # clock() when the last chunk was relayed (0: none yet)
        watch = StallWatch(replica_s=self._t.chunk_s, client_s=self._t.send_s)
        failed: str | None = None
        d.on_first_chunk(replica)  # the replica's first chunk is here (before the client's send)
        try:
            async with watch:  # on the client's side from here, until the first read
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                out.status = 200
                out.first_byte_at = clock()
                data = first
                while data:
                    chunk = feed(data)
                    if chunk:
                        now = clock()
                        if last:
                            observe_itl(now - last)
                        last = now
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    watch.step += 1  # waiting on the replica
                    data = await resp.read_some()
                    watch.step += 1  # on the client
        except TimeoutError:
            if watch.expired == "client":
                self._gave_up_on_client(out)
                return
            failed = "stream_timeout"
        except BrokenError:
            failed = "stream_broken"
        finally:  # also when cancelled: settling a stream the client left needs the events relayed
            out.usage = filt.usage
            out.events = filt.events
        held, partial = filt.flush()  # events a CR-framed stream's last read could not yet end
        if d.rewrite is not None:
            held = held.replace(*d.rewrite)
        out.usage = filt.usage
        out.events = filt.events
        if filt.done:
            # The answer is whole, however the connection ended after [DONE] (closed: a close-delimited
            # body; stalled): the client has nothing to wait for and the replica did its job.
            if failed is None:
                resp.release()
            tail = held + partial
        else:
            kind = out.error_kind = failed or "stream_broken"  # closed cleanly, but without [DONE]
            self._metrics.upstream_errors.labels(replica.name, kind).inc()
            self._report_failure(replica.name, kind)
            err = GatewayError(502, f"the replica stopped answering mid-stream ({kind})")
            # A partial event is dropped: the client could not parse it, nor the error event after it.
            tail = held + err.sse_event() + _DONE
        try:
            async with asyncio.timeout(self._t.send_s):
                await send({"type": "http.response.body", "body": tail, "more_body": False})
        except TimeoutError:
            self._gave_up_on_client(out)
            return
        out.ended_at = time.perf_counter()

    def _gave_up_on_client(self, out: Outcome) -> None:
        """The client took nothing for send_s: its doing, not the replica's. The caller's return
        closes the upstream request; the ASGI server closes the unfinished client response."""
        out.slow_client = True
        self._metrics.slow_clients.inc()


def _passed_on(raw: list[Header], own: frozenset[bytes] = frozenset()) -> list[Header]:
    """The replica's response headers a client gets (see the module docstring), except the names in
    `own` (lower case: set by kvgate for this answer) and what a `Connection` header names."""
    named = own
    out: list[Header] = []
    for name, value in raw:
        low = name.lower()
        if low == b"connection":
            named = named | {t.strip().lower() for t in value.split(b",")}
        elif low not in _NOT_PASSED and not low.startswith(b"x-kvgate-"):
            out.append((name, value))
    if named:
        out = [(n, v) for n, v in out if n.lower() not in named]
    return out


def _rewriting(feed: Callable[[bytes], bytes], old: bytes, new: bytes) -> Callable[[bytes], bytes]:
    """`feed` whose whole events carry `new` where the replica wrote `old` (bytes.replace: a search
    of the chunk, a copy only when found). `old` is `"model":<JSON string>` as vLLM writes it (no
    space after the colon); inside a JSON string every quote is escaped, so only a key matches."""

    def rewriting_feed(data: bytes) -> bytes:
        return feed(data).replace(old, new)

    return rewriting_feed


def _final_error(kind: str, detail: str) -> GatewayError:
    if kind == "timeout":
        return GatewayError(504, "no replica answered in time")
    if kind == "status_5xx":
        return GatewayError(503, "every replica tried was unavailable")
    return GatewayError(
        502,
        f"could not reach a replica ({kind}: {detail})" if detail else f"could not reach a replica ({kind})",
    )
