"""UpstreamConnection against fuzzed answers: a scripted loopback server writes a response built by
hypothesis (status line, headers, a body framed by content-length, chunks or the close, interim 1xx
answers), often then damaged (bytes flipped, inserted or cut), and closes. The client either reads
the response it was sent, to the byte, or raises BrokenError; never another exception, and never
waits on a connection that has ended."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.upstream import BrokenError
from tests.gateway.upstream.scripted import connect, get, read_request, server

WAIT = 5.0  # the server closes after writing: any wait this long is a hang
BAD_STATUS_LINES = [
    b"HTTP/1.1 200\r\n",
    b"HTTP/1.0 200 OK\r\n",
    b"HTTP/2 200\r\n",
    b"HTTP/1.1 99 X\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n",
]  # replace an answer's status line (some are valid HTTP/1.0 or unusual, not all broken)


@dataclass(frozen=True)
class Answer:
    raw: bytes
    status: int | None  # what the client must read (None: it may read anything or refuse)
    body: bytes | None
    broken: bool = False  # the client must refuse it (a framed answer cut short)


def _chunked(body: bytes, cuts: list[int], ext: bool, trailer: bool) -> bytes:
    out, at = b"", 0
    for n in [*cuts, len(body)]:
        n = min(max(n, at), len(body))
        if n > at:
            out += b"%x%s\r\n%s\r\n" % (n - at, b";x=y" if ext else b"", body[at:n])
            at = n
    return out + b"0\r\n" + (b"x-t: 1\r\n" if trailer else b"") + b"\r\n"


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    status = draw(st.sampled_from([200, 200, 201, 204, 304, 400, 429, 500, 503]))
    body = b"" if status in (204, 304) else draw(st.binary(max_size=300))
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    interim = draw(
        st.sampled_from(
            [b"", b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nlink: x\r\n\r\n"]
        )
    )
    head = b"HTTP/1.1 %d X\r\ncontent-type: text/event-stream\r\n" % status
    if status in (204, 304):
        raw, framing = head + b"\r\n", "none"
    elif framing == "length":
        raw = head + b"content-length: %d\r\n\r\n" % len(body) + body
    elif framing == "chunked":
        cuts = draw(st.lists(st.integers(0, 300), max_size=5).map(sorted))
        raw = (
            head
            + b"transfer-encoding: chunked\r\n\r\n"
            + _chunked(body, cuts, draw(st.booleans()), draw(st.booleans()))
        )
    else:
        raw = head + b"connection: close\r\n\r\n" + body
    raw = interim + raw
    damage = draw(st.sampled_from(["none", "none", "flip", "insert", "cut", "replace-head", "garbage"]))
    if damage == "none":
        return Answer(raw, status, body)
    if damage == "garbage":
        return Answer(draw(st.binary(max_size=200)), None, None)
    at = draw(st.integers(0, max(len(raw) - 1, 0)))
    if damage == "flip" and raw:
        raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
    elif damage == "insert":
        raw = raw[:at] + draw(st.binary(min_size=1, max_size=8)) + raw[at:]
    elif damage == "cut":  # a framed answer cut anywhere is broken; one ending at the close is shorter
        head_end = raw.rfind(b"\r\n\r\n", 0, len(raw) - len(body) if framing == "close" else len(raw)) + 4
        if framing == "close" and at >= head_end:
            return Answer(raw[:at], status, raw[head_end:at])
        return Answer(raw[:at], None, None, broken=True)
    else:
        head = draw(st.sampled_from(BAD_STATUS_LINES))
        raw = head + raw.split(b"\r\n", 1)[-1]
    return Answer(raw, None, None)


def _collect(n: int) -> list[Answer]:
    out: list[Answer] = []

    @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(answer=answers())
    def collect(answer: Answer) -> None:
        out.append(answer)

    collect()
    return out


async def test_fuzzed_answers_are_read_exactly_or_broken_never_anything_else() -> None:
    outcomes = {"read": 0, "broken": 0}
    for answer in _collect(300):

        async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter, raw: bytes = answer.raw) -> None:
            await read_request(r)
            w.write(raw)
            await w.drain()

        async with server(handler) as (url, _):
            conn = await connect(url)
            try:
                async with asyncio.timeout(WAIT):
                    conn.start(get())
                    await conn.wait_headers()
                    status, body = conn.status, await conn.read_all()
            except BrokenError:
                assert answer.status is None, f"a whole answer was refused: {answer.raw!r}"
                outcomes["broken"] += 1
                continue
            except TimeoutError:
                raise AssertionError(f"waited {WAIT} s on an ended connection: {answer.raw!r}") from None
            else:
                outcomes["read"] += 1
                assert not answer.broken, f"an answer cut short was read as whole: {answer.raw!r}"
                if answer.status is not None:
                    assert (status, body) == (answer.status, answer.body), answer.raw
            finally:
                conn.abort()
    assert outcomes["read"] > 0 and outcomes["broken"] > 0, outcomes
