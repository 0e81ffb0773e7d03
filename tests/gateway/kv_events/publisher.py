"""A stand-in for vLLM's KV-event publisher on 127.0.0.1, for tests: real ZeroMQ sockets, vLLM's frames.

It does what `ZmqEventPublisher` (vllm/distributed/kv_events.py) does on the wire: a PUB-side socket
sending `[topic, seq, payload]`, and a ROUTER that answers `[id, b"", start_seq]` with `[id, b"", seq,
payload]` for every buffered batch from `start_seq` and then `[id, b"", -1, b""]`. It differs where a
test needs control: the PUB side is an XPUB so a test can wait until the subscriber is connected
(a PUB drops what it sends before that), `publish(..., live=False)` keeps a batch for replay without
sending it (a lost message), and `forget_before` trims the replay buffer (a buffer that moved on).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from gateway.kv_events.wire import REPLAY_END, decode_seq, encode_seq


class FakePublisher:
    def __init__(self, *, replay: bool = True) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub: Any = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, a resubscription's too
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.router: Any = None
        self.replay_endpoint: str | None = None
        if replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            rport = self.router.bind_to_random_port("tcp://127.0.0.1")
            self.replay_endpoint = f"tcp://127.0.0.1:{rport}"
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self.answer_replays = True  # False: requests are read and never answered (a stuck publisher)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> FakePublisher:
        if self.router is not None:
            self._task = asyncio.create_task(self._serve_replays())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.ctx.destroy(linger=0)

    async def wait_subscribed(self, timeout: float = 10.0) -> None:
        """Until a subscriber's subscription message arrives (it is then connected)."""
        async with asyncio.timeout(timeout):
            while True:
                msg = await self.pub.recv()
                if msg[:1] == b"\x01":
                    return

    async def publish(self, frames: list[bytes], *, live: bool = True) -> None:
        """A `[topic, seq, payload]` message: buffered for replay, and sent unless `live` is False."""
        seq = decode_seq(frames[1])
        self.buffer.append((seq, frames[2]))
        if live:
            await self.pub.send_multipart(frames)

    async def send_raw(self, frames: list[bytes]) -> None:
        await self.pub.send_multipart(frames)

    def forget_before(self, seq: int) -> None:
        self.buffer = [(s, p) for s, p in self.buffer if s >= seq]

    def restart(self) -> None:
        """A new engine process: its replay buffer starts empty (the sockets are the same here)."""
        self.buffer = []

    async def restart_sockets(self, timeout: float = 10.0) -> None:
        """A new engine process on the same address, sockets and all: the PUB socket closes (its
        subscribers see the connection drop) and a new one binds the same port, and the replay
        buffer starts empty. The replay socket stays (its requests are answered from the buffer)."""
        self.pub.close(linger=0)
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        async with asyncio.timeout(timeout):
            while True:  # ZeroMQ's I/O thread lets go of the old listener a moment after close
                try:
                    self.pub.bind(self.endpoint)
                    break
                except zmq.ZMQError:
                    await asyncio.sleep(0.01)
        self.buffer = []

    async def _serve_replays(self) -> None:
        while True:
            frames = await self.router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            self.replay_requests.append(start)
            if not self.answer_replays:
                continue
            for seq, payload in self.buffer:
                if seq >= start:
                    await self.router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            await self.router.send_multipart([client, b"", encode_seq(REPLAY_END), b""])


def stored(hashes: list[int], parent: int | None, token_ids: list[int], block_size: int) -> dict[str, Any]:
    """A BlockStored event as vLLM 0.32 encodes it (a map tagged by `type`)."""
    return {
        "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": token_ids,
        "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None,
        "extra_keys": [None] * len(hashes), "group_idx": 0, "kv_cache_spec_kind": "full_attention",
    }  # fmt: skip


def removed(hashes: list[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": 0}


def batch(seq: int, events: list[dict[str, Any]], topic: str = "kv") -> list[bytes]:
    """The frames of one message: `[topic, seq, msgpack [ts, events, data_parallel_rank]]`."""
    return [topic.encode(), encode_seq(seq), msgpack.packb([1_700_000_000.0 + seq, events, 0])]
