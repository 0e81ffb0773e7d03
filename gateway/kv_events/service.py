"""KvEvents: a subscriber per replica that publishes KV events, the exact index they feed, and each
replica's prefix-index mode.

    kv = KvEvents(config, fleet)       # the index exists at once; sockets open in start()
    await kv.start()
    kv.exact_block_sizes(names, now)   # routing: replica -> engine block size, for those in exact mode
    kv.dispatched(replica)             # a request went there (staleness is judged against traffic)
    await kv.stop()

Which replicas: every member of the fleet whose endpoints resolve (gateway/kv_events/endpoints.py)
gets a subscriber when it joins, a new one when its URL changes (a new process), its pool becomes
known or a reload changes its endpoints, and none once it leaves. Each new subscriber starts the
replica's picture over, empty and incomplete until its events say more.

The mode of a replica (`kvgate_prefix_index_mode{replica,mode}`): "exact" when its events are in
order, its index is complete (policies/exact_index.py) and not stale (policies/kv_freshness.py), and
its pool has a tokenizer (without one kvgate has no tokens to match); "approximate" otherwise, in
which case routing uses the approximate index for it, as for a replica without events.

Reload: endpoints and topics are hot (`models`, `replicas`); the staleness and replay timeouts
(`scheduling.prefix_index`) need a restart. One event loop; no locking.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.config import Config
from gateway.fleet.state import FleetChange, FleetState
from gateway.kv_events.endpoints import KvEndpoints, resolve
from gateway.kv_events.feed import ReplicaFeed
from gateway.kv_events.subscriber import Subscriber
from gateway.metrics import gauge_family
from gateway.reload import ReloadStep
from policies.exact_index import ExactIndex

log = logging.getLogger(__name__)

_GUESS_BLOCK_SIZE = 16  # the exact index's bound before cache_config_info: default tokens / this


@dataclass(slots=True)
class _Running:
    endpoints: KvEndpoints
    pool: str
    feed: ReplicaFeed
    subscriber: Subscriber
    task: asyncio.Task[None]


class KvEvents:
    def __init__(
        self, config: Config, fleet: FleetState, clock: Callable[[], float] = time.monotonic
    ) -> None:
        pi = config.scheduling.prefix_index
        self._config = config
        self._fleet = fleet
        self._clock = clock
        self._stale_after_s = pi.events_stale_after_s
        self._replay_timeout_s = pi.replay_timeout_s
        self.index = ExactIndex(default_capacity=max(1, pi.default_capacity_tokens // _GUESS_BLOCK_SIZE))
        self._running: dict[str, _Running] = {}
        self._ctx: zmq.asyncio.Context | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # subscribers' tasks, until they have ended
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        self._started = True
        self._fleet.add_listener(self._on_fleet_change)
        self.sync_all()

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        self._fleet.remove_listener(self._on_fleet_change)
        for name in list(self._running):
            self._stop(name)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def prepare(self, old: Config, new: Config) -> ReloadStep:
        """Reload: the endpoints are looked at again once discovery has applied the new static list."""

        def commit() -> None:
            self._config = new

        async def settle() -> None:
            self.sync_all()

        return ReloadStep(commit, settle)

    # -- routing -----------------------------------------------------------------------------------

    def exact_block_sizes(self, names: Iterable[str], now: float) -> dict[str, int]:
        """Of `names`, the replicas in exact mode -> their engine's block size (events first, then
        `cache_config_info`)."""
        out: dict[str, int] = {}
        running = self._running
        if not running:
            return out
        for name in names:
            r = running.get(name)
            if r is None or not r.feed.exact(now):
                continue
            size = self.index.block_size(name)
            if size is None:
                state = self._fleet.snapshot().by_name(name)
                size = state.block_size if state is not None else None
            if size:
                out[name] = size
        return out

    def dispatched(self, replica: str) -> None:
        r = self._running.get(replica)
        if r is not None:
            r.feed.freshness.dispatched(self._clock())

    def mode(self, replica: str, now: float) -> str:
        r = self._running.get(replica)
        exact = (
            r is not None and self._config.model_settings(r.pool).tokenizer != "none" and r.feed.exact(now)
        )
        return "exact" if exact else "approximate"

    def feed(self, replica: str) -> ReplicaFeed | None:
        r = self._running.get(replica)
        return None if r is None else r.feed

    # -- membership --------------------------------------------------------------------------------

    def sync_all(self) -> None:
        names = set(self._fleet.names())
        for name in list(self._running):
            if name not in names:
                self._stop(name)
        for name in names:
            self.sync(name)

    def sync(self, name: str, restart: bool = False) -> None:
        """Start, restart or stop `name`'s subscriber to match the config and its fleet record."""
        if not self._started:
            return
        want: KvEndpoints | None = None
        pool = self._fleet.pool_of_replica(name)
        if name in self._fleet.names() and pool:
            want = resolve(self._fleet.spec(name), pool, self._config)
        have = self._running.get(name)
        if have is not None and not restart and want == have.endpoints and pool == have.pool:
            return
        if have is not None:
            self._stop(name)
        if want is not None:
            self._start(name, pool, want)

    def _on_fleet_change(self, name: str, change: FleetChange) -> None:
        if change & FleetChange.LEFT:
            self._stop(name)
        elif change & (FleetChange.JOINED | FleetChange.RESET | FleetChange.POOL):
            self.sync(name, restart=bool(change & FleetChange.RESET))
        if change & FleetChange.CAPACITY and name in self._running:
            state = self._fleet.snapshot().by_name(name)
            if state is not None:
                self.index.set_capacity(name, state.num_gpu_blocks)

    def _start(self, name: str, pool: str, endpoints: KvEndpoints) -> None:
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        state = self._fleet.snapshot().by_name(name)
        self.index.add_replica(name, pool, state.num_gpu_blocks if state is not None else 0)
        feed = ReplicaFeed(
            name,
            self.index,
            can_replay=endpoints.replay is not None,
            stale_after_s=self._stale_after_s,
            topic=endpoints.topic,
        )
        sub = Subscriber(
            self._ctx,
            feed,
            endpoints.events,
            endpoints.replay,
            replay_timeout_s=self._replay_timeout_s,
            clock=self._clock,
        )
        task = asyncio.get_running_loop().create_task(sub.run(), name=f"kvgate-kv-events-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._running[name] = _Running(endpoints, pool, feed, sub, task)
        log.info("replica %s: KV events from %s (replay %s)", name, endpoints.events, endpoints.replay or "-")

    def _stop(self, name: str) -> None:
        r = self._running.pop(name, None)
        if r is None:
            return
        r.task.cancel()
        self.index.remove_replica(name)

    # -- metrics -----------------------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        now = self._clock()
        mode = GaugeMetricFamily(
            "kvgate_prefix_index_mode",
            "1 for the prefix index a replica is routed on: exact (its KV events) or approximate.",
            labels=["replica", "mode"],
        )
        for name in self._fleet.names():
            current = self.mode(name, now)
            for m in ("exact", "approximate"):
                mode.add_metric([name, m], 1.0 if m == current else 0.0)
        yield mode
        yield gauge_family(
            "kvgate_exact_index_blocks",
            "Engine blocks the exact index holds for the replica.",
            "replica",
            [(n, self.index.blocks(n)) for n in self._running],
        )
        counters: Sequence[tuple[str, str, Callable[[ReplicaFeed], int]]] = (
            ("kvgate_kv_events", "KV events received and applied.", lambda f: f.events),
            ("kvgate_kv_event_batches", "KV-event batches applied.", lambda f: f.batches),
            ("kvgate_kv_event_invalid_messages", "Messages that were not KV-event batches (skipped).",
             lambda f: f.invalid),
            ("kvgate_kv_event_gaps", "Jumps in the replica's batch sequence.", lambda f: f.tracker.gaps),
            ("kvgate_kv_event_replays", "Replays asked of the replica's replay socket.",
             lambda f: f.tracker.replays),
            ("kvgate_kv_event_replays_filled", "Replays that brought every missing batch.",
             lambda f: f.tracker.replays_filled),
            ("kvgate_kv_event_losses", "Times batches were lost for good (the exact index started over).",
             lambda f: f.tracker.losses),
            ("kvgate_kv_event_restarts", "A new engine process on the replica's address (its sequence went "
             "back, or a reconnection found other batches).", lambda f: f.tracker.restarts),
            ("kvgate_kv_event_reconnects", "Connections to the publisher that dropped and came back.",
             lambda f: f.tracker.reconnects),
            ("kvgate_kv_event_unkeyable_blocks", "Blocks stored under a parent the exact index did not hold.",
             lambda f: f.unkeyable),
            ("kvgate_kv_event_overflows", "Exact index resets: more blocks than the engine holds.",
             lambda f: f.overflows),
        )  # fmt: skip
        for name, doc, read in counters:
            family = CounterMetricFamily(name, doc, labels=["replica"])
            for replica, r in self._running.items():
                family.add_metric([replica], read(r.feed))
            yield family
