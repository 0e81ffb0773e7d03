"""A test-side KV-event consumer over real ZeroMQ sockets on loopback: SUB for live batches, DEALER for
replays. Reads every message with the gateway's decoder (`gateway.kv_events.wire`), the one kvgate uses
on real vLLM frames. Every wait is bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType

import zmq
import zmq.asyncio

from gateway.kv_events.wire import REPLAY_END, EventBatch, decode_message, decode_seq, encode_seq

WAIT_S = 5.0


class Subscriber:
    """A SUB socket on one replica's PUB endpoint; `batches` keeps what it received, in order."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, topic: bytes = b"") -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(endpoint)
        self.batches: list[EventBatch] = []
        self.frames: list[list[bytes]] = []

    async def recv(self, timeout: float = WAIT_S) -> EventBatch:
        async with asyncio.timeout(timeout):
            frames = await self.sock.recv_multipart()
        self.frames.append(frames)
        batch = decode_message(frames)
        self.batches.append(batch)
        return batch

    async def recv_until(self, seq: int, timeout: float = WAIT_S) -> list[EventBatch]:
        """Receive until the batch with sequence `seq` (the ones received on the way are returned)."""
        got: list[EventBatch] = []
        async with asyncio.timeout(timeout):
            while not got or got[-1].seq != seq:
                got.append(await self.recv(timeout))
        return got

    async def go_live(self, trigger: Callable[[int], Awaitable[object]], attempts: int = 20) -> EventBatch:
        """Until the subscription has reached the publisher (ZeroMQ's slow joiner), call `trigger(i)`
        (something that makes the replica publish); the first batch received live."""
        for i in range(attempts):
            await trigger(i)
            try:
                return await self.recv(timeout=0.5)
            except TimeoutError:
                continue
        raise AssertionError(f"no KV-event batch received after {attempts} attempts")

    def close(self) -> None:
        self.sock.close(linger=0)


async def replay(ctx: zmq.asyncio.Context, endpoint: str, start: int) -> list[list[bytes]]:
    """Ask the ROUTER at `endpoint` for every kept batch from `start`: the frames received, the end
    marker included (a DEALER sees `[b"", seq, payload]`)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        await sock.send_multipart([b"", encode_seq(start)])
        got: list[list[bytes]] = []
        async with asyncio.timeout(WAIT_S):
            while not got or decode_seq(got[-1][1]) != REPLAY_END:
                got.append(await sock.recv_multipart())
        return got
    finally:
        sock.close(linger=0)


class ZmqContext:
    """`async with ZmqContext() as ctx`: a private asyncio context, terminated at the end."""

    async def __aenter__(self) -> zmq.asyncio.Context:
        self.ctx = zmq.asyncio.Context()
        return self.ctx

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.ctx.destroy(linger=0)
