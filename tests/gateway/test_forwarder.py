"""The forwarder alone: a real UpstreamPool to scripted loopback replicas, a recording ASGI `send`, a
recording `report_failure`. Failover happens only before the first byte to the client; after it a
stream ends with an error event and `data: [DONE]`, and only a replica's own failure is blamed on it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, MutableMapping, Sequence
from typing import Any

import orjson
import pytest

from gateway.errors import GatewayError
from gateway.forwarder import Dispatch, Forwarder, Outcome, Timeouts
from gateway.metrics import GatewayMetrics
from gateway.sse_filter import Usage
from gateway.upstream import UpstreamPool
from loadtests.ports import free_port
from policies.types import ReplicaState
from tests.gateway.scripted_replica import (
    LAST_CHUNK,
    SSE_HEAD,
    SSE_HEAD_CLOSE_DELIMITED,
    Handler,
    Scripted,
    chunk,
    event,
    read_request,
    scripted,
    unary,
    until_closed,
)
from tests.vllm_fixtures import VLLM_FIXTURES

STREAM = (VLLM_FIXTURES / "chat_stream.sse").read_bytes()
USAGE_EVENT = next(e + b"\n\n" for e in STREAM.split(b"\n\n") if b'"usage":{' in e)
ANSWER = (VLLM_FIXTURES / "chat_nonstream.json").read_bytes()
ERROR = (VLLM_FIXTURES / "err_malformed.json").read_bytes()
ROLE = event(b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}')
TOKEN = event(b'{"choices":[{"index":0,"delta":{"content":" zaf"}}]}')
DONE = b"data: [DONE]\n\n"
MODEL = "tiny-llama"
WAIT = 5.0  # bound on anything that should take a fraction of a second
SHORT = 0.3  # the timeout a test waits for


class Client:
    """A recording ASGI `send`. With `block_at` = n, the n-th body message and every later one
    never complete: a client that stopped reading."""

    def __init__(self, block_at: int = 0) -> None:
        self.messages: list[MutableMapping[str, Any]] = []
        self.got_body = asyncio.Event()
        self._block_at = block_at
        self._bodies = 0

    async def __call__(self, msg: MutableMapping[str, Any]) -> None:
        if msg["type"] == "http.response.body":
            self._bodies += 1
            if self._block_at and self._bodies >= self._block_at:
                await asyncio.Event().wait()
            self.got_body.set()
        self.messages.append(msg)

    @property
    def status(self) -> int:
        return int(next(m["status"] for m in self.messages if m["type"] == "http.response.start"))

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(next(m["headers"] for m in self.messages if m["type"] == "http.response.start"))

    @property
    def body(self) -> bytes:
        return b"".join(m["body"] for m in self.messages if m["type"] == "http.response.body")

    @property
    def ended(self) -> bool:
        return any(m["type"] == "http.response.body" and not m["more_body"] for m in self.messages)

    def relayed_chunks(self) -> int:
        return sum(1 for m in self.messages if m["type"] == "http.response.body" and m["more_body"])


class Harness:
    """A Forwarder over a real pool, with what it reported, the hooks it called and its metrics."""

    def __init__(self, **timeouts: float) -> None:
        t = {"connect_s": 1.0, "first_byte_s": WAIT, "chunk_s": WAIT, "response_s": WAIT, "send_s": WAIT}
        t.update(timeouts)
        self.pool = UpstreamPool(connect_timeout_s=t["connect_s"])
        self.metrics = GatewayMetrics()
        self.reports: list[tuple[str, str]] = []
        self.attempts: list[str] = []
        self.ended: list[str] = []
        self.fw = Forwarder(
            self.pool, Timeouts(**t), max_retries=2, metrics=self.metrics,
            report_failure=lambda name, kind: self.reports.append((name, kind)),
        )  # fmt: skip

    def dispatch(self, urls: Sequence[str], stream: bool = True, strip_usage: bool = False) -> Dispatch:
        ranked = [ReplicaState(name=f"r{i}", url=u, pool=MODEL) for i, u in enumerate(urls)]
        return Dispatch(
            path="/v1/chat/completions",
            body=b'{"model": "tiny-llama"}',
            ranked=ranked,
            stream=stream,
            strip_usage=strip_usage,
            response_headers=[(b"x-test", b"1")],
            on_attempt=lambda r: self.attempts.append(r.name),
            on_attempt_end=lambda r: self.ended.append(r.name),
            observe_itl=self.metrics.for_model(MODEL).itl.observe,
        )

    async def forward(self, d: Dispatch, client: Client) -> Outcome:
        async with asyncio.timeout(WAIT):
            return await self.fw.forward(d, client, Outcome())

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    def blamed(self) -> list[str]:
        return [name for name, _ in self.reports]


@contextlib.asynccontextmanager
async def forwarder(**timeouts: float) -> AsyncIterator[Harness]:
    h = Harness(**timeouts)
    try:
        yield h
    finally:
        h.pool.close()


def closed_port() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def answers(reply: bytes) -> Handler:
    """A keep-alive replica answering every request with the same bytes."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        while True:
            await read_request(r, state)
            w.write(reply)
            await w.drain()

    return handler


def sse_error(body: bytes) -> dict[str, Any]:
    """The error event kvgate appended to a stream, checked to be followed by `[DONE]` and last."""
    assert body.endswith(b"\n\n" + DONE), body[-300:]
    last = body[: -len(DONE)].rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"data: {")
    err: dict[str, Any] = orjson.loads(last[6:])["error"]
    return err


OK_STREAM = answers(SSE_HEAD + chunk(STREAM) + LAST_CHUNK)
OK_UNARY = answers(unary(ANSWER))


# -- failover, before the first byte only ------------------------------------------------------------


async def test_connect_refused_fails_over_and_blames_only_the_dead_replica() -> None:
    async with forwarder() as h, scripted(OK_STREAM) as good:
        c = Client()
        out = await h.forward(h.dispatch([closed_port(), good.url]), c)
    assert c.status == 200 and c.body == STREAM and c.headers[b"x-kvgate-replica"] == b"r1"
    assert c.headers[b"x-test"] == b"1" and c.ended
    assert h.blamed() == ["r0"] and h.attempts == h.ended == ["r0", "r1"]
    assert out.replica == "r1" and out.attempts == 2 and out.error_kind is None


async def test_502_and_503_fail_over_and_the_last_replica_s_answer_passes_through() -> None:
    busy = answers(unary(ERROR, 503, b"Service Unavailable"))
    bad_gateway = answers(unary(ERROR, 502, b"Bad Gateway"))
    async with forwarder() as h, scripted(busy) as r0, scripted(bad_gateway) as r1, scripted(OK_UNARY) as r2:
        c = Client()
        out = await h.forward(h.dispatch([r0.url, r1.url, r2.url], stream=False), c)
        assert c.status == 200 and c.body == ANSWER and out.replica == "r2"
        assert h.reports == [("r0", "status_5xx"), ("r1", "status_5xx")]
        assert h.metric("kvgate_retries_total", reason="status_5xx") == 2
        # The last replica tried: its own 503 and body reach the client, as it wrote them.
        c = Client()
        out = await h.forward(h.dispatch([r0.url, r0.url], stream=True), c)
        assert c.status == 503 and c.body == ERROR and c.headers[b"content-type"] == b"application/json"


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("sends_headers", [False, True])
async def test_no_first_byte_in_time_fails_over(stream: bool, sends_headers: bool) -> None:
    async def hangs(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        await read_request(r, state)
        if sends_headers:
            w.write(SSE_HEAD if stream else b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
        await until_closed(r, state)

    async with forwarder(first_byte_s=SHORT, response_s=SHORT) as h, scripted(hangs) as r0, \
            scripted(OK_STREAM if stream else OK_UNARY) as r1:  # fmt: skip
        c = Client()
        await h.forward(h.dispatch([r0.url, r1.url], stream=stream), c)
        assert c.body == (STREAM if stream else ANSWER)
        assert h.reports == [("r0", "timeout")]
        await asyncio.wait_for(r0.eof.wait(), WAIT)  # the abandoned attempt was closed upstream


async def test_unary_answer_broken_before_its_end_fails_over() -> None:
    async def truncated(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        await read_request(r, state)
        w.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"id"')
        await w.drain()

    async with forwarder() as h, scripted(truncated) as r0, scripted(OK_UNARY) as r1:
        c = Client()
        out = await h.forward(h.dispatch([r0.url, r1.url], stream=False), c)
    assert c.status == 200 and c.body == ANSWER and h.blamed() == ["r0"] and out.replica == "r1"


async def test_every_replica_failing_is_a_gateway_error_and_nothing_is_sent() -> None:
    async with forwarder() as h:
        c = Client()
        with pytest.raises(GatewayError) as info:
            await h.forward(h.dispatch([closed_port(), closed_port()]), c)
    assert info.value.status == 502 and c.messages == [] and h.blamed() == ["r0", "r1"]


async def test_nothing_after_the_first_byte_fails_over() -> None:
    async def breaks(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        await read_request(r, state)
        w.write(SSE_HEAD + chunk(ROLE) + chunk(TOKEN))
        await w.drain()  # then closes, the chunked body unfinished

    async with forwarder() as h, scripted(breaks) as r0, scripted(OK_STREAM) as r1:
        c = Client()
        out = await h.forward(h.dispatch([r0.url, r1.url]), c)
    assert r1.accepted == 0 and h.attempts == ["r0"]
    assert c.status == 200 and c.body.startswith(ROLE + TOKEN) and c.ended
    assert sse_error(c.body)["code"] == 502
    assert h.reports == [("r0", "stream_broken")] and out.error_kind == "stream_broken"
    assert out.events == 2


# -- what passes through ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_error_bodies_pass_through_with_their_status(stream: bool) -> None:
    async with forwarder() as h, scripted(answers(unary(ERROR, 400, b"Bad Request"))) as r0, \
            scripted(OK_STREAM) as r1:  # fmt: skip
        c = Client()
        out = await h.forward(h.dispatch([r0.url, r1.url], stream=stream), c)
    assert c.status == 400 and c.body == ERROR and c.headers[b"content-type"] == b"application/json"
    assert c.headers[b"content-length"] == b"%d" % len(ERROR) and c.ended
    assert h.reports == [] and r1.accepted == 0 and out.status == 400 and out.usage is None


async def test_usage_is_taken_from_a_unary_answer() -> None:
    async with forwarder() as h, scripted(OK_UNARY) as r0:
        c = Client()
        out = await h.forward(h.dispatch([r0.url], stream=False), c)
    u = orjson.loads(ANSWER)["usage"]
    assert c.body == ANSWER and out.status == 200
    assert out.usage == Usage(u["prompt_tokens"], u["completion_tokens"], 0)


@pytest.mark.parametrize("strip", [False, True])
async def test_usage_is_taken_from_a_stream_and_stripped_when_the_client_did_not_ask(strip: bool) -> None:
    async with forwarder() as h, scripted(OK_STREAM) as r0:
        c = Client()
        out = await h.forward(h.dispatch([r0.url], strip_usage=strip), c)
    assert c.body == (STREAM.replace(USAGE_EVENT, b"") if strip else STREAM)
    assert out.usage == Usage(25, 16, 0) and h.reports == [] and out.error_kind is None
    assert out.first_byte_at is not None and out.ended_at is not None


@pytest.mark.parametrize("sep", [b"\r\n\r\n", b"\r\r"], ids=["CRLF", "CR"])
async def test_a_stream_framed_with_cr_line_ends_is_relayed_whole_with_its_usage(sep: bytes) -> None:
    framed = b"".join(e + sep for e in STREAM.split(b"\n\n") if e)
    usage_event = next(e + sep for e in STREAM.split(b"\n\n") if b'"usage":{' in e)
    async with forwarder() as h, scripted(answers(SSE_HEAD + chunk(framed) + LAST_CHUNK)) as r0:
        c = Client()
        out = await h.forward(h.dispatch([r0.url], strip_usage=True), c)
    assert c.body == framed.replace(usage_event, b"") and c.ended
    assert out.usage == Usage(25, 16, 0) and out.error_kind is None and h.reports == []


# -- streams that end badly ---------------------------------------------------------------------------


async def test_a_replica_stalling_early_in_a_stream_ends_it_within_the_chunk_timeout() -> None:
    async def stalls(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        await read_request(r, state)
        w.write(SSE_HEAD + chunk(ROLE))
        await w.drain()
        w.write(chunk(TOKEN))
        await until_closed(r, state)  # and nothing more: the socket stays open

    async with forwarder(chunk_s=SHORT) as h, scripted(stalls) as r0, scripted(OK_STREAM) as r1:
        c = Client()
        out = await h.forward(h.dispatch([r0.url, r1.url]), c)  # bounded by WAIT
        await asyncio.wait_for(r0.eof.wait(), WAIT)
    assert c.body.startswith(ROLE + TOKEN) and sse_error(c.body)["code"] == 502 and c.ended
    assert h.reports == [("r0", "stream_timeout")] and r1.accepted == 0
    assert h.metric("kvgate_upstream_errors_total", replica="r0", kind="stream_timeout") == 1
    assert out.status == 200 and out.events == 2 and out.ended_at is not None


@pytest.mark.parametrize("end", [LAST_CHUNK, b""], ids=["clean end", "connection closed"])
async def test_a_stream_ending_without_done_is_broken(end: bytes) -> None:
    async def ends(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        await read_request(r, state)
        w.write(SSE_HEAD + chunk(ROLE + TOKEN) + end)
        await w.drain()
        if end:
            await until_closed(r, state)

    async with forwarder() as h, scripted(ends) as r0:
        c = Client()
        out = await h.forward(h.dispatch([r0.url]), c)
    assert c.body.startswith(ROLE + TOKEN) and sse_error(c.body)["code"] == 502
    assert h.reports == [("r0", "stream_broken")] and out.error_kind == "stream_broken"


@pytest.mark.parametrize(
    "head", [SSE_HEAD_CLOSE_DELIMITED, SSE_HEAD], ids=["close-delimited", "chunked, unterminated"]
)
async def test_a_stream_that_delivered_done_and_then_closed_succeeded(head: bytes) -> None:
    async def then_closes(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        await read_request(r, state)
        w.write(head + (STREAM if head is SSE_HEAD_CLOSE_DELIMITED else chunk(STREAM)))
        await w.drain()  # and the handler returns: the connection closes

    async with forwarder() as h, scripted(then_closes) as r0:
        c = Client()
        out = await h.forward(h.dispatch([r0.url]), c)
    assert c.body == STREAM and c.ended
    assert h.reports == [] and out.error_kind is None and out.usage == Usage(25, 16, 0)


async def test_a_close_delimited_stream_without_done_is_broken() -> None:
    async def closes(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        await read_request(r, state)
        w.write(SSE_HEAD_CLOSE_DELIMITED + ROLE + TOKEN)
        await w.drain()

    async with forwarder() as h, scripted(closes) as r0:
        c = Client()
        await h.forward(h.dispatch([r0.url]), c)
    assert c.body.startswith(ROLE + TOKEN) and sse_error(c.body)["code"] == 502
    assert h.reports == [("r0", "stream_broken")]


# -- the client's side --------------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["waiting for the first byte", "mid-stream"])
async def test_client_cancellation_closes_the_upstream(when: str) -> None:
    started = asyncio.Event()

    async def long(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        await read_request(r, state)
        started.set()
        if when == "mid-stream":
            w.write(SSE_HEAD + chunk(ROLE))
        await until_closed(r, state)

    async with forwarder() as h, scripted(long) as r0:
        c = Client()
        out = Outcome()
        task = asyncio.ensure_future(h.fw.forward(h.dispatch([r0.url]), c, out))
        await asyncio.wait_for((c.got_body if when == "mid-stream" else started).wait(), WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(r0.eof.wait(), WAIT)  # vLLM aborts the request on this close
    assert h.reports == [] and h.ended == ["r0"]
    assert out.status == (200 if when == "mid-stream" else 0)
    assert out.events == (1 if when == "mid-stream" else 0)


async def test_a_client_that_stops_reading_mid_stream_is_dropped_and_the_replica_not_blamed() -> None:
    async def endless(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        await read_request(r, state)
        w.write(SSE_HEAD + chunk(ROLE))
        while True:
            await asyncio.sleep(0.01)
            w.write(chunk(TOKEN))
            await w.drain()

    async with forwarder(send_s=SHORT) as h, scripted(endless) as r0, scripted(OK_STREAM) as r1:
        c = Client(block_at=3)
        out = await h.forward(h.dispatch([r0.url, r1.url]), c)  # bounded by WAIT
        await asyncio.wait_for(r0.eof.wait(), WAIT)  # the replica was told: closed
    assert out.slow_client and out.status == 200 and out.error_kind is None
    assert h.reports == [] and r1.accepted == 0
    assert h.metric("kvgate_slow_clients_total") == 1
    assert h.metric("kvgate_upstream_errors_total", replica="r0", kind="stream_timeout") == 0
    assert out.events >= 2  # what was relayed is charged


async def test_a_unary_client_that_stops_reading_neither_fails_over_nor_blames_the_replica() -> None:
    # The answer arrives well within response_s; the client then takes longer than response_s to read
    # it: neither timeout belongs to the replica once the answer is going out.
    async with forwarder(response_s=SHORT, send_s=2 * SHORT) as h, scripted(OK_UNARY) as r0, \
            scripted(OK_UNARY) as r1:  # fmt: skip
        c = Client(block_at=1)
        out = await h.forward(h.dispatch([r0.url, r1.url], stream=False), c)
    assert out.slow_client and out.status == 200 and c.status == 200
    assert h.reports == [] and r1.accepted == 0 and out.usage is not None


# -- what a stream costs to keep ---------------------------------------------------------------------


async def test_inter_chunk_latency_is_observed_as_the_stream_goes() -> None:
    events = [ROLE, *[TOKEN] * 8, DONE]

    async def paced(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        await read_request(r, state)
        w.write(SSE_HEAD)
        for e in events:
            w.write(chunk(e))
            await w.drain()
            await asyncio.sleep(0.01)
        w.write(LAST_CHUNK)
        await until_closed(r, state)

    async with forwarder() as h, scripted(paced) as r0:
        c = Client()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        out = await h.forward(h.dispatch([r0.url]), c)
        elapsed = loop.time() - t0
    relayed = c.relayed_chunks()
    assert c.body == b"".join(events) and relayed >= 2
    count = h.metric("kvgate_inter_chunk_latency_seconds_count", model=MODEL)
    total = h.metric("kvgate_inter_chunk_latency_seconds_sum", model=MODEL)
    assert count == relayed - 1
    assert 0 < total <= elapsed
    # Nothing in the outcome grows with the stream.
    assert not any(isinstance(getattr(out, f.name), list | dict | bytearray) for f in dataclasses.fields(out))
