"""What the forwarder sends a replica besides the body (its credential, the request id), and which of
the replica's response headers reach the client. Scripted replicas record the exact request head."""

from __future__ import annotations

import asyncio

import pytest

from gateway.forwarder import Forwarder, Timeouts
from gateway.replica_auth import ReplicaCredentials
from tests.gateway.scripted_replica import SSE_HEAD, Scripted, chunk, scripted
from tests.gateway.test_forwarder import ANSWER, DONE, TOKEN, WAIT, Client, Harness, forwarder

RID = (b"x-request-id", b"req-42")
CREDS = ReplicaCredentials(
    by_replica={"r1": (b"authorization", b"Bearer replica-one")},
    by_pool={"tiny-llama": (b"authorization", b"Bearer pool-key")},
)
# What a replica (or a proxy in front of it) may answer with, beside the body.
EXTRA = (
    b"x-custom: kept\r\n"
    b"server: uvicorn\r\n"
    b"date: Thu, 03 Dec 2026 13:00:00 GMT\r\n"
    b"x-request-id: the-replica-s-own\r\n"
    b"x-kvgate-replica: spoofed\r\n"
    b"connection: keep-alive, x-hop\r\n"
    b"x-hop: per-hop\r\n"
    b"cache-control: private\r\n"
)


def heads_recorder(answer: bytes) -> tuple[list[bytes], object]:
    heads: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        head = await r.readuntil(b"\r\n\r\n")
        heads.append(head)
        length = next(
            int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")
        )
        await r.readexactly(length)
        w.write(answer)
        await w.drain()

    return heads, handler


def header_lines(head: bytes) -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = {}
    for line in head.split(b"\r\n")[1:]:
        if line:
            name, value = line.split(b":", 1)
            out.setdefault(name.strip().lower(), []).append(value.strip())
    return out


def unary_with_extra(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        + EXTRA
        + b"\r\n"
        + body
    )


def with_credentials(h: Harness) -> None:
    t = Timeouts(connect_s=1.0, first_byte_s=WAIT, chunk_s=WAIT, response_s=WAIT, send_s=WAIT)
    h.fw = Forwarder(
        h.pool, t, max_retries=2, metrics=h.metrics, report_failure=lambda *_: None, credentials=CREDS
    )


@pytest.mark.parametrize(("replica", "key"), [(0, b"Bearer pool-key"), (1, b"Bearer replica-one")])
async def test_the_replica_gets_its_credential_and_the_request_id_never_the_client_s_key(
    replica: int, key: bytes
) -> None:
    heads, handler = heads_recorder(unary_with_extra(ANSWER))
    async with forwarder() as h, scripted(handler) as rep:  # type: ignore[arg-type]
        with_credentials(h)
        urls = ["http://127.0.0.1:1"] * replica + [rep.url]  # r0 refused when the replica is r1
        d = h.dispatch(urls, stream=False)
        d.upstream_headers = (RID,)
        await h.forward(d, Client())
    lines = header_lines(heads[-1])
    assert lines[b"authorization"] == [key]
    assert lines[b"x-request-id"] == [b"req-42"]
    assert lines[b"accept-encoding"] == [b"identity"]  # kvgate reads bodies: never compressed


async def test_without_a_credential_no_authorization_is_sent() -> None:
    heads, handler = heads_recorder(unary_with_extra(ANSWER))
    async with forwarder() as h, scripted(handler) as rep:  # type: ignore[arg-type]
        await h.forward(h.dispatch([rep.url], stream=False), Client())
    assert b"authorization" not in header_lines(heads[0])


@pytest.mark.parametrize("stream", [False, True])
async def test_replica_headers_pass_through_except_hop_by_hop_framing_and_kvgate_s_own(stream: bool) -> None:
    answer = (
        unary_with_extra(ANSWER)
        if not stream
        else SSE_HEAD.replace(b"\r\n\r\n", b"\r\n" + EXTRA + b"\r\n") + chunk(TOKEN + DONE) + b"0\r\n\r\n"
    )
    _, handler = heads_recorder(answer)
    client = Client()
    async with forwarder() as h, scripted(handler) as rep:  # type: ignore[arg-type]
        await h.forward(h.dispatch([rep.url], stream=stream), client)
    start = next(m for m in client.messages if m["type"] == "http.response.start")
    names = [n.lower() for n, _ in start["headers"]]
    headers = dict(start["headers"])
    assert headers[b"x-custom"] == b"kept"
    assert names.count(b"x-kvgate-replica") == 1 and headers[b"x-kvgate-replica"] == b"r0"
    for dropped in (b"server", b"date", b"x-request-id", b"connection", b"x-hop", b"transfer-encoding"):
        assert dropped not in names, dropped
    assert names.count(b"content-type") == 1
    if stream:  # kvgate's own SSE cache-control wins over the replica's
        assert names.count(b"cache-control") == 1 and headers[b"cache-control"] == b"no-cache"
    else:
        assert headers[b"cache-control"] == b"private"
