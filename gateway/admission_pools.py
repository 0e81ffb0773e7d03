"""The admission queue's pools (gateway/admission.py): which replicas each pool has, and how many
requests it can take now.

Per POOL (a request's base model) a `Pool`: its fair queue, a drain-rate estimate for Retry-After,
the tenants' fair shares, and a count of requests released from the queue but not yet dispatched.

Room. A replica can take `replica_headroom` more requests (policies/saturation: 0 when unhealthy,
stale, queueing more than `max_waiting_per_replica`, KV-full or at `max_in_flight_per_replica`; else
the smaller of its in-flight room and its engine-queue room). The engine-queue room comes from the
last scrape, so on its own it would let a burst through again and again on one stale number; each
request kvgate sent the replica since that scrape (its in-flight count now minus at the scrape, net
of completions) is therefore counted as having joined the engine queue until the next scrape says
otherwise. In-flight counts are live (FleetState.dispatched runs when the forwarder starts), and the
requests released from the queue whose tasks have not yet reached the forwarder are subtracted
(`pending`), so one capacity event never releases more than the pool can take. Net effect: between
two scrapes a replica gets at most `max_waiting_per_replica + 1 - waiting` new requests beyond those
that finished, and never more than `max_in_flight_per_replica` at once. A pool with no healthy
replica at all is not "saturated" but down (room `DOWN`): requests are not held for it (routing
answers 503 at once instead of after a queue timeout). Replicas not in service (not ready,
terminating) have no room and do not count as healthy here.

The fair-share reserve (who may take it: gateway/admission.py) is `reserve_per_replica`, at most half
of `max_in_flight_per_replica`, x the pool's healthy replicas.

Membership changes (replicas joining, leaving, changing pool) rebuild the pools' replica positions
lazily, on the first call after the fleet's `membership_version` moved (`sync`); a pool, with its
queue, outlives its last replica.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from gateway.config import FlowControlConfig
from gateway.errors import GatewayError
from gateway.fleet.state import FleetState
from policies.drain_rate import DrainRate
from policies.fair_queue import FairQueue
from policies.fair_share import FairShare
from policies.latency_admission import LatencySlo
from policies.saturation import SaturationThresholds, replica_headroom
from policies.types import ReplicaState

DOWN = 1 << 30  # "room" of a pool with no healthy replica: do not hold requests for it


@dataclass(frozen=True, slots=True)
class Waiter:
    """A request waiting in a pool's queue: `wake(None)` releases it, `wake(error)` refuses it (each
    returns False when the waiter has already left); `prompt_tokens`, `slo` and `prefix_keys` size
    the latency gate's room while it is the queue's head."""

    wake: Callable[[GatewayError | None], bool]
    prompt_tokens: int
    slo: LatencySlo
    prefix_keys: tuple[int, ...] = ()


@dataclass(slots=True)
class Pool:
    name: str
    indexes: tuple[int, ...]  # positions of its replicas in the fleet snapshot (see `sync`)
    drain: DrainRate
    share: FairShare
    queue: FairQueue[Waiter] = field(default_factory=FairQueue)
    pending: int = 0  # released from the queue, not yet dispatched


def _thresholds(cfg: FlowControlConfig, stale_after_s: float) -> SaturationThresholds:
    sat = cfg.saturation
    return SaturationThresholds(
        max_waiting_per_replica=sat.max_waiting_per_replica,
        max_kv_usage=sat.max_kv_usage,
        max_in_flight_per_replica=sat.max_in_flight_per_replica,
        stale_after_s=stale_after_s,
    )


class AdmissionPools:
    """The pools of one FleetState, their replicas, and their room (see the module doc)."""

    def __init__(
        self, cfg: FlowControlConfig, stale_after_s: float, fleet: FleetState, clock: Callable[[], float]
    ) -> None:
        self.thr = _thresholds(cfg, stale_after_s)
        self._reserve_per_replica = cfg.fair_share.reserve_per_replica
        self._window = cfg.fair_share.active_window_s
        self._fleet = fleet
        self._clock = clock
        self._pools: dict[str, Pool] = {}
        self._replica_pool: dict[str, Pool] = {}
        self._names: tuple[str, ...] = ()  # replica names in snapshot order, as `_at_scrape`
        self._position: dict[str, int] = {}  # replica name -> its position in the snapshot
        self._at_scrape: list[int] = []  # each replica's in-flight count at its last good scrape
        self._membership = -1  # the fleet's membership_version the pools were built for
        self.sync()

    def reconfigure(self, cfg: FlowControlConfig) -> None:
        """Take a reloaded `flow_control` section's thresholds, reserve and activity window."""
        self.thr = _thresholds(cfg, self.thr.stale_after_s)
        self._reserve_per_replica = cfg.fair_share.reserve_per_replica
        self._window = cfg.fair_share.active_window_s
        for p in self._pools.values():
            p.share.window_s = self._window

    def get(self, pool: str) -> Pool | None:
        """`pool` as of the last `sync` (None: not a pool of this fleet)."""
        return self._pools.get(pool)

    def of_replica(self, replica: str) -> Pool | None:
        """The pool `replica` is in, as of the last `sync`."""
        return self._replica_pool.get(replica)

    def __iter__(self) -> Iterator[Pool]:
        return iter(self._pools.values())

    def replicas(self) -> Sequence[ReplicaState]:
        """The fleet's replicas now; a pool's `indexes` point into it while `sync` is up to date."""
        return self._fleet.snapshot().replicas

    def scraped(self, replica: str) -> None:
        """`replica` (in a pool, as of the last `sync`) has fresh metrics: what it was sent before
        them is in its engine-queue count now."""
        i = self._position[replica]
        self._at_scrape[i] = self.replicas()[i].in_flight

    def sync(self) -> None:
        """Rebuild the pools' replica positions after the fleet's membership changed (replicas
        joined, left or changed pool): positions in a snapshot hold only between two changes.
        A pool keeps its queue, drain rate and shares across changes, also while it has no replica."""
        fleet = self._fleet
        if fleet.membership_version == self._membership:
            return
        self._membership = fleet.membership_version
        replicas = fleet.snapshot().replicas
        positions: dict[str, list[int]] = {}
        for i, r in enumerate(replicas):
            if r.pool:
                positions.setdefault(r.pool, []).append(i)
        now = self._clock()
        for name in positions:
            if name not in self._pools:
                self._pools[name] = Pool(name, (), DrainRate(now), FairShare(self._window))
        for name, p in self._pools.items():
            p.indexes = tuple(positions.get(name, ()))
        at_scrape = dict(zip(self._names, self._at_scrape, strict=True))
        self._names = tuple(r.name for r in replicas)
        self._position = {n: i for i, n in enumerate(self._names)}
        self._at_scrape = [at_scrape.get(n, 0) for n in self._names]
        self._replica_pool = {r.name: self._pools[r.pool] for r in replicas if r.pool}

    def room(self, p: Pool, now: float, enough: int) -> int:
        """Requests the pool can take now (see the module doc), counting up to `enough` at least;
        `DOWN` when it has no healthy replica."""
        self.sync()
        replicas = self.replicas()
        thr = self.thr
        queue_room = thr.max_waiting_per_replica + 1
        room = -p.pending
        healthy = False
        for i in p.indexes:
            r = replicas[i]
            healthy = healthy or (r.healthy and r.in_service)
            h = replica_headroom(r, thr, now)
            if h <= 0:
                continue
            sent = r.in_flight - self._at_scrape[i]
            if sent > 0:
                h = min(h, queue_room - r.waiting - sent)
                if h <= 0:
                    continue
            room += h
            if room >= enough:
                return room
        return room if healthy else DOWN

    def reserve(self, p: Pool) -> int:
        """The pool's fair-share reserve (see the module doc)."""
        # Never more than half a replica's slots: the reserve is slack, not a partition.
        per = min(self._reserve_per_replica, self.thr.max_in_flight_per_replica // 2)
        return per * self.serving(p) if per else 0

    def serving(self, p: Pool) -> int:
        """The pool's healthy replicas in service."""
        self.sync()
        replicas = self.replicas()
        return sum(1 for i in p.indexes if replicas[i].healthy and replicas[i].in_service)
