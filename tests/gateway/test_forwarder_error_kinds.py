"""Forwarder._try_one's failure kinds, against scripted loopback replicas: what reaches
`report_failure` decides ejection ("connect" ejects a replica at once), so a replica that only closed
idle keep-alive connections, or dropped one request, must not be reported as refusing connections."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import pytest

from gateway.errors import GatewayError
from gateway.forwarder import Dispatch, Forwarder, Timeouts
from gateway.metrics import GatewayMetrics
from gateway.upstream import UpstreamPool
from policies.types import ReplicaState
from tests.gateway.upstream.scripted import read_head, read_request, reply, server
from tests.gateway.upstream.test_pool import one_answer_per_connection


class Recorder:
    """`report_failure` as the fleet state receives it."""

    def __init__(self) -> None:
        self.failures: list[tuple[str, str]] = []

    def __call__(self, replica: str, kind: str) -> None:
        self.failures.append((replica, kind))


def forwarder(pool: UpstreamPool, recorder: Recorder) -> Forwarder:
    timeouts = Timeouts(connect_s=1, first_byte_s=2, chunk_s=2, response_s=2, send_s=2)
    return Forwarder(pool, timeouts, max_retries=0, metrics=GatewayMetrics(), report_failure=recorder)


def dispatch(url: str, body: bytes) -> Dispatch:
    return Dispatch(
        path="/v1/completions",
        body=body,
        ranked=[ReplicaState(name="r", url=url, pool="m")],
        stream=False,
        strip_usage=False,
        response_headers=[],
        on_attempt=lambda r: None,
        on_attempt_end=lambda r: None,
    )


async def forward(fwd: Forwarder, url: str, body: bytes) -> list[MutableMapping[str, Any]]:
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    async with asyncio.timeout(5):
        await fwd.forward(dispatch(url, body), send)
    return sent


async def test_stale_pooled_connections_are_not_reported_as_a_refused_connect() -> None:
    async with server(one_answer_per_connection()) as (url, accepted):
        pool, recorder = UpstreamPool(connect_timeout_s=1), Recorder()
        fwd = forwarder(pool, recorder)
        await asyncio.gather(*(forward(fwd, url, b'{"n": %d}' % i) for i in range(2)))
        sent = await forward(fwd, url, b'{"n": 3}')  # both idle connections are stale now
        assert sent[0]["status"] == 200 and sent[1]["body"] == b'{"n": 3}'
        assert recorder.failures == []
        assert len(accepted) == 3
        pool.close()


async def test_a_fresh_connection_dropped_before_any_answer_is_broken_not_refused() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_head(r)
        w.transport.abort()  # accepted, then dropped: a failure, but the replica is there

    async with server(handler) as (url, _):
        pool, recorder = UpstreamPool(connect_timeout_s=1), Recorder()
        with pytest.raises(GatewayError) as ei:
            await forward(forwarder(pool, recorder), url, b"{}")
        assert ei.value.status == 502
        assert recorder.failures == [("r", "broken")]
        pool.close()


async def test_a_refused_connection_is_still_reported_as_connect() -> None:
    async with server(lambda r, w: read_request(r)) as (url, _):
        pass  # closed: the port now refuses
    pool, recorder = UpstreamPool(connect_timeout_s=1), Recorder()
    with pytest.raises(GatewayError):
        await forward(forwarder(pool, recorder), url, b"{}")
    assert recorder.failures == [("r", "connect")]
    pool.close()


async def test_a_good_answer_reports_nothing() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        body = await read_request(r)
        w.write(reply(body))
        await w.drain()
        await r.read()

    async with server(handler) as (url, _):
        pool, recorder = UpstreamPool(connect_timeout_s=1), Recorder()
        sent = await forward(forwarder(pool, recorder), url, b'{"ok": 1}')
        assert sent[0]["status"] == 200 and sent[1]["body"] == b'{"ok": 1}'
        assert recorder.failures == []
        pool.close()
