"""The sockets of one replica's KV events: a SUB on its publisher, a DEALER for each replay.

vLLM's publisher (vllm/distributed/kv_events.py, `ZmqEventPublisher`) binds a PUB socket that sends
`[topic, seq, payload]` and, optionally, a ROUTER replay socket: a client sends it the first sequence
it wants as 8 big-endian bytes, after an empty delimiter frame; the ROUTER answers `[b"", seq,
payload]` for every buffered batch from there on and then `[b"", -1, b""]`. A REQ socket takes one
answer per request, so kvgate uses a DEALER (which sends and receives the delimiter itself), a new
one per replay so that a late answer to an abandoned replay can never be taken for the next.

ZeroMQ reconnects a SUB by itself when the publisher restarts; ZMTP heartbeats find a peer that
vanished without closing. A socket monitor tells the subscriber when the connection came back, and
the feed then checks with a replay whether it is the same engine (policies/kv_sequence.py): a
restarted one whose first batches were lost in the reconnection is caught even if it numbers on from
where the old one stopped, and even if it publishes nothing more for a while. When the events go
stale while the replica works (`ReplicaFeed.exact`), the SUB is closed and opened again: a
resubscription, in case the connection is half-open in a way heartbeats missed. All of it runs as
one task per replica on the gateway's event loop; every frame goes to the feed, which does no I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from gateway.kv_events.feed import ReplicaFeed
from gateway.kv_events.wire import encode_seq

log = logging.getLogger(__name__)

_HEARTBEAT_MS = 5_000  # ZMTP ping interval; a peer silent for 3 of them is dropped and reconnected
_RECONNECT_MAX_MS = 5_000
_TICK_S = 1.0  # how often a quiet loop looks at replay deadlines and staleness


class Subscriber:
    """Runs `feed` from `endpoint` (and `replay_endpoint`, if any) until cancelled."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        feed: ReplicaFeed,
        endpoint: str,
        replay_endpoint: str | None,
        *,
        replay_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx
        self.feed = feed
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.replay_timeout_s = replay_timeout_s
        self.clock = clock
        self.subscriptions = 0  # SUB sockets opened (1 + resubscriptions)
        self.reconnects = 0  # connections that dropped and came back
        self._dealer: zmq.asyncio.Socket | None = None
        self._replay_deadline = 0.0
        self._subscribed_at = 0.0

    async def run(self) -> None:
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug or a socket error: never let one replica's events stop for good
                log.exception("replica %s: KV-event subscriber failed; resubscribing", self.feed.name)
                await asyncio.sleep(1.0)

    async def _session(self) -> None:
        """One SUB socket's life: until the events go stale while the replica works."""
        sub = self._socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.feed.topic.encode("utf-8"))
        sub.connect(self.endpoint)
        self.subscriptions += 1
        self._subscribed_at = self.clock()
        monitor: Any = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        dropped = False  # the connection went down since it was last up
        try:
            while True:
                ready = dict(await poller.poll(_TICK_S * 1000))
                now = self.clock()
                if monitor in ready:
                    event = parse_monitor_message(await monitor.recv_multipart())["event"]
                    if event == zmq.EVENT_DISCONNECTED:
                        dropped = True
                    elif event == zmq.EVENT_CONNECTED and dropped:
                        dropped = False
                        self.reconnects += 1
                        start = self.feed.on_reconnected()
                        if start is not None:
                            self._ask_replay(poller, start, now)
                if sub in ready:
                    start = self.feed.on_live(await sub.recv_multipart(), now)
                    if start is not None:
                        self._ask_replay(poller, start, now)
                dealer = self._dealer
                if dealer is not None and dealer in ready:
                    # The end marker may leave another replay to ask for (a new engine's history).
                    start = self.feed.on_replayed(await dealer.recv_multipart(), now)
                    if start is not None:
                        self._ask_replay(poller, start, now)
                replaying = self.feed.tracker.replaying
                if self._dealer is not None and (now > self._replay_deadline or not replaying):
                    if replaying:
                        log.warning("replica %s: KV-event replay got no end in time", self.feed.name)
                    start = self.feed.on_replay_failed()
                    self._close_dealer(poller)
                    if start is not None:
                        self._ask_replay(poller, start, now)
                if (
                    not ready
                    and self.feed.freshness.stale(now)
                    and now - self._subscribed_at > self.feed.freshness.stale_after_s
                ):  # at most one resubscription per stale period; stale (approximate) until heard
                    log.info("replica %s: KV events stale while it serves; resubscribing", self.feed.name)
                    return
        finally:
            self._close_dealer(poller)
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    def _ask_replay(self, poller: zmq.asyncio.Poller, start: int, now: float) -> None:
        self._close_dealer(poller)
        if self.replay_endpoint is None:  # the tracker asks only when it can replay
            self.feed.on_replay_failed()
            return
        dealer = self._socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        # Queued until the connection is up; with LINGER 0 it dies with the socket if it never is.
        dealer.send_multipart([b"", encode_seq(start)])
        poller.register(dealer, zmq.POLLIN)
        self._dealer = dealer
        self._replay_deadline = now + self.replay_timeout_s

    def _close_dealer(self, poller: zmq.asyncio.Poller) -> None:
        dealer, self._dealer = self._dealer, None
        if dealer is not None:
            with contextlib.suppress(KeyError):
                poller.unregister(dealer)
            dealer.close(linger=0)

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        sock: Any = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, _RECONNECT_MAX_MS)
        sock.setsockopt(zmq.HEARTBEAT_IVL, _HEARTBEAT_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * _HEARTBEAT_MS)
        sock.setsockopt(zmq.IPV6, 1)
        assert isinstance(sock, zmq.asyncio.Socket)
        return sock
