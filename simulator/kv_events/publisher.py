"""One replica's KV-cache event publisher on ZeroMQ: vLLM's `ZmqEventPublisher`, run on the replica's loop.

What a subscriber sees is what vLLM sends (`vllm/distributed/kv_events.py`, `KVEventsConfig`):

- PUB socket (`endpoints.pub`): one message `[topic, sequence, payload]` per engine step that produced
  events (`simulator/kv_events/wire.py`); sequences count from 0, +1 per message. The topic is
  `DEFAULT_TOPIC` ("", vLLM's default) unless configured.
- ROUTER socket (`endpoints.replay`): the last `DEFAULT_BUFFER_STEPS` (10,000) messages are kept. A
  request is `[b"", start]` from a DEALER (or `start` alone from a REQ), `start` being 8 bytes
  big-endian: the first sequence wanted. The answer is one message `[b"", sequence, payload]` per kept
  message from `start` on, in order, then `[b"", -1 as 8 bytes, b""]`. (Routing frames are the
  ROUTER's: a DEALER receives the empty frame, a REQ does not.) A request of another shape is ignored.

A new publisher (a restarted replica) starts again at sequence 0 with an empty buffer, as a restarted
vLLM does; a subscriber notices by the sequence going back.

Publishing never blocks the engine: the PUB socket sends without waiting (ZeroMQ drops messages for a
subscriber past `hwm` queued, as in vLLM). Replays are served by a task on the same loop; unlike vLLM,
which drops replies past the ROUTER's high-water mark, a replay waits for a slow requester, up to
`REPLAY_TIMEOUT_S`. Everything here runs on one event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import time
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio

from simulator.kv_events import DEFAULT_BUFFER_STEPS, DEFAULT_TOPIC, KVEventEndpoints
from simulator.kv_events.events import KVEvent
from simulator.kv_events.wire import REPLAY_END, decode_replay_start, encode_payload, encode_seq

log = logging.getLogger(__name__)

DEFAULT_HWM = 100_000  # vLLM's KVEventsConfig.hwm
REPLAY_TIMEOUT_S = 10.0
_REBIND_POLL_S = 0.02
_END = encode_seq(REPLAY_END)


def tcp_endpoint(host: str, port: int | str) -> str:
    """`tcp://host:port` (IPv6 hosts bracketed); port "*" binds a free one."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


_contexts: tuple[zmq.Context[zmq.Socket[bytes]], zmq.asyncio.Context] | None = None


def _zmq_contexts() -> tuple[zmq.Context[zmq.Socket[bytes]], zmq.asyncio.Context]:
    """The process's ZeroMQ context, as a sync one (PUB) and an asyncio view of it (ROUTER)."""
    global _contexts
    if _contexts is None:
        sync: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        _contexts = (sync, zmq.asyncio.Context(sync))
    return _contexts


class KVEventPublisher:
    """PUB + ROUTER for one replica (see the module docstring). Make with `await open(...)`, then
    `start()`, `publish(...)` per engine step, `await close()`."""

    def __init__(self, pub: zmq.Socket[bytes], replay: zmq.asyncio.Socket, endpoints: KVEventEndpoints, *,
                 topic: str, buffer_steps: int, clock: Callable[[], float] = time.time) -> None:
        self.endpoints = endpoints
        self.topic = topic
        self._topic = topic.encode("utf-8")
        self._pub = pub
        self._replay = replay
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_steps)
        self._clock = clock
        self._next_seq = 0
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.publish_errors = 0

    @classmethod
    async def open(
        cls, host: str, pub_port: int, replay_port: int, *, topic: str = DEFAULT_TOPIC,
        buffer_steps: int = DEFAULT_BUFFER_STEPS, hwm: int = DEFAULT_HWM, rebind_timeout_s: float = 0.0,
    ) -> KVEventPublisher:
        """Bind both sockets on `host` (port 0: a free one). `rebind_timeout_s` > 0 retries a port still
        held by a publisher just closed (ZeroMQ releases it in the background). OSError if a port is taken.
        """
        if buffer_steps < 1:
            raise ValueError(f"buffer_steps must be >= 1, got {buffer_steps}")
        sync_ctx, async_ctx = _zmq_contexts()
        pub = sync_ctx.socket(zmq.PUB)
        replay = async_ctx.socket(zmq.ROUTER)
        try:
            pub.setsockopt(zmq.SNDHWM, hwm)
            replay.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unknown or gone requester raises, not vanishes
            for sock in (pub, replay):
                sock.setsockopt(zmq.LINGER, 0)
                if ":" in host:
                    sock.setsockopt(zmq.IPV6, 1)
            deadline = time.monotonic() + rebind_timeout_s
            endpoints = KVEventEndpoints(
                pub=await _bind(pub, tcp_endpoint(host, pub_port or "*"), deadline),
                replay=await _bind(replay, tcp_endpoint(host, replay_port or "*"), deadline),
            )
        except BaseException:
            pub.close(linger=0)
            replay.close(linger=0)
            raise
        return cls(pub, replay, endpoints, topic=topic, buffer_steps=buffer_steps)

    @property
    def next_seq(self) -> int:
        """The sequence the next message gets (= messages published so far)."""
        return self._next_seq

    def start(self) -> None:
        """Serve replay requests (a task on the running loop)."""
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._serve_replays(),
                                                                name="kvgate-sim-kv-replay")

    def publish(self, events: Sequence[KVEvent]) -> int | None:
        """Send one batch of `events` (nothing when empty); its sequence, or None if nothing was sent.
        Never blocks and never raises for a send that fails (it is logged and counted)."""
        if not events or self._closed:
            return None
        seq = self._next_seq
        payload = encode_payload(self._clock(), events)
        self._next_seq = seq + 1
        self._buffer.append((seq, payload))
        try:
            self._pub.send_multipart((self._topic, encode_seq(seq), payload), flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # a PUB socket drops rather than blocks; anything else is a fault
            self.publish_errors += 1
            log.warning("KV event batch %d not published: %s", seq, exc)
        return seq

    async def close(self) -> None:
        """Stop serving replays and close both sockets at once (queued messages are dropped)."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._pub.close(linger=0)
        self._replay.close(linger=0)

    async def _serve_replays(self) -> None:
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                log.warning("KV event replay request ignored: %d frames, expected 3", len(frames))
                continue
            client, _, start = frames
            try:
                async with asyncio.timeout(REPLAY_TIMEOUT_S):
                    await self._replay_from(client, decode_replay_start(start))
            except (TimeoutError, zmq.ZMQError) as exc:
                log.warning("KV event replay abandoned: %s", exc or "requester too slow")

    async def _replay_from(self, client: bytes, start: int) -> None:
        send = self._replay.send_multipart
        for seq, payload in list(self._buffer):  # a copy: publishing goes on while this awaits
            if seq >= start:
                await send((client, b"", encode_seq(seq), payload))
        await send((client, b"", _END, b""))


async def _bind(sock: zmq.Socket[bytes] | zmq.asyncio.Socket, endpoint: str, deadline: float) -> str:
    """Bind `sock` and return the endpoint it got (the real port for "*")."""
    while True:
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            if exc.errno == errno.EADDRINUSE and time.monotonic() < deadline:
                await asyncio.sleep(_REBIND_POLL_S)
                continue
            raise OSError(exc.errno, f"KV events: cannot bind {endpoint}: {exc.strerror}") from exc
        bound = sock.getsockopt(zmq.LAST_ENDPOINT)
        return bound.decode() if isinstance(bound, bytes) else str(bound)
