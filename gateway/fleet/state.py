"""FleetState: the gateway's one live picture of its replicas, and the frozen snapshots taken from it.

Writers: membership (`apply`, from the static list and every discovery source through
`gateway.discovery.Reconciler`; `drain`/`undrain`, from the admin API), the scraper (`record_scrape`,
`record_health`, `record_models`, `report_failure`) and the forwarder (`dispatched`, `finished`,
`report_failure`). Readers: the request path (`snapshot`, `pool_of`, `routable`), the models endpoint
(`models`), the prefix index (`kv_capacity_tokens`, listeners), `/ready` and the admin API.
Everything runs on the event loop thread; nothing here blocks or awaits, and nothing is locked.

Membership. Replicas are keyed by name. `apply(desired)` makes the fleet match a desired set: a new
name joins (NOT_READY until its phase says otherwise, see `gateway.fleet.membership`), a changed spec
is updated in place (a new URL is a new process: its scrape state and cache picture start over), and
a name missing from `desired` departs: forgotten at once when kvgate has no request on it, else kept
as TERMINATING until its last request finishes, so every `dispatched` is matched by a `finished` on
the same record. Writers given a name the fleet does not know (a scrape or a request that outlived
its replica) do nothing. `membership_version` grows whenever replicas join or leave or change pool:
positions in a snapshot are only stable between two such changes.

`snapshot()` runs on every request, so it is O(1) while nothing changed: it returns the same
`FleetSnapshot` object until a replica's record changes, and then rebuilds only the changed
replicas' `ReplicaState`s. Its `taken_at` is the clock reading when it was last rebuilt (the picture
is unchanged since); judge freshness (`ReplicaState.is_fresh`) with the caller's own `now`.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.config import FleetConfig, ReplicaConfig
from gateway.fleet.membership import ReplicaSpec
from gateway.fleet.metrics_parse import ReplicaMetrics
from gateway.fleet.models_parse import ServedModels
from gateway.fleet.replica import ReplicaRecord
from policies.types import FleetSnapshot, ReplicaPhase, ReplicaState

log = logging.getLogger(__name__)


class FleetChange(enum.Flag):
    """What changed on a replica, as listeners are told (several flags may come at once)."""

    METRICS = enum.auto()  # a good scrape brought fresh numbers
    HEALTH = enum.auto()  # ejected, or back in rotation
    MODELS = enum.auto()  # the adapters or base models it serves changed
    CAPACITY = enum.auto()  # its KV capacity (block size x blocks) changed, first scrape included
    RELEASED = enum.auto()  # a request kvgate sent it finished (in-flight went down)
    JOINED = enum.auto()  # a new member (its record exists when listeners are told)
    PHASE = enum.auto()  # ready / not ready / terminating changed
    POOL = enum.auto()  # it moved to another pool (its model changed or became known)
    RESET = enum.auto()  # its URL changed: a new process, whose cache holds nothing kvgate sent
    DEPARTED = enum.auto()  # it left its source; requests still waiting on it should go elsewhere
    LEFT = enum.auto()  # forgotten (its record is gone when listeners are told)


FleetListener = Callable[[str, FleetChange], None]


@dataclass(frozen=True, slots=True)
class FleetModels:
    """The fleet's model names: pools (membership order) and adapters -> the pool whose replicas serve
    them. An adapter served in two pools resolves to the first pool in membership order."""

    base_models: tuple[str, ...]
    adapters: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Applied:
    """What one `apply` did, by replica name (each in apply's order)."""

    joined: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()  # spec changed in place (URL, model, labels, source's phase, ...)
    departed: tuple[str, ...] = ()  # left the desired set (forgotten now, or once its requests end)


class FleetState:
    """Live state of the fleet's replicas. Built with the static `replicas:` list (config order,
    names unique); `apply` changes membership from then on.

    Reads and drains of a name the fleet does not know raise KeyError; other writers ignore it.
    """

    def __init__(
        self,
        replicas: Sequence[ReplicaConfig],
        fleet: FleetConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._fleet = fleet
        specs = [ReplicaSpec.from_config(r) for r in replicas]
        if len({s.name for s in specs}) != len(specs):
            raise ValueError("replica names must be unique")
        self._records: dict[str, ReplicaRecord] = {}
        self._states: dict[str, ReplicaState] = {}
        self._dirty: set[str] = set()
        self._listeners: list[FleetListener] = []
        self._version = 0
        self._membership_version = 0
        self._pools: frozenset[str] = frozenset()
        self._models = FleetModels(base_models=())
        self._snapshot = FleetSnapshot((), clock())
        self._reshaped = True  # the snapshot's tuple must be rebuilt (membership changed)
        self.apply({s.name: s for s in specs})

    # -- reading --------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """Grows by one or more on every change (scrape, health, models, in-flight). Never shrinks."""
        return self._version

    @property
    def membership_version(self) -> int:
        """Grows whenever replicas join, leave or change pool. Never shrinks."""
        return self._membership_version

    def names(self) -> tuple[str, ...]:
        """Every member's name, in snapshot order."""
        return tuple(self._records)

    def spec(self, replica: str) -> ReplicaSpec:
        """The member's spec, as its source last gave it."""
        return self._records[replica].spec

    def phase(self, replica: str) -> ReplicaPhase:
        return self._records[replica].phase

    def pool_of_replica(self, replica: str) -> str:
        """The member's pool ("" while it is not known yet, or for an unknown name)."""
        record = self._records.get(replica)
        return record.pool if record is not None else ""

    def drained(self, replica: str) -> bool:
        return self._records[replica].drained

    def routable(self, replica: str) -> bool:
        """A member that may take a new request now (READY). False for an unknown name."""
        record = self._records.get(replica)
        return record is not None and record.phase is ReplicaPhase.READY

    def snapshot(self) -> FleetSnapshot:
        """The current frozen picture; the same object until something changes (see module doc)."""
        if self._dirty or self._reshaped:
            states = self._states
            records = self._records
            for name in self._dirty:
                record = records.get(name)
                if record is not None:
                    states[name] = record.to_state()
            self._dirty.clear()
            self._reshaped = False
            self._snapshot = FleetSnapshot(tuple(states.values()), self._clock())
        return self._snapshot

    def models(self) -> FleetModels:
        """Pools and adapters the fleet serves (cached; rebuilt when a replica's adapters change)."""
        return self._models

    def pool_of(self, model: str) -> tuple[str, str | None] | None:
        """Resolve a requested `model`: a pool -> (pool, None); an adapter -> (its pool, adapter);
        unknown -> None. A name that is both a pool and an adapter resolves to the pool. A pool is
        known while it has a member, ready or not (a request for it then waits or gets 503, not 404)."""
        if model in self._pools:
            return model, None
        pool = self._models.adapters.get(model)
        return None if pool is None else (pool, model)

    def kv_capacity_tokens(self, replica: str) -> int | None:
        """The replica's KV cache in tokens (block_size x num_gpu_blocks), None until it reports it
        (and for a name the fleet does not know)."""
        record = self._records.get(replica)
        return None if record is None else record.kv_capacity_tokens

    def prefix_counters(self, replica: str) -> tuple[int, int] | None:
        """(prefix-cache hit tokens, query tokens) since the replica started, from its last good
        scrape; None before the first (and for a name the fleet does not know)."""
        record = self._records.get(replica)
        if record is None or record.metrics is None:
            return None
        return record.metrics.prefix_hits_tokens, record.metrics.prefix_queries_tokens

    def scrape_age_s(self, replica: str) -> float | None:
        """Seconds since the replica's last good scrape; None before the first (or unknown name)."""
        record = self._records.get(replica)
        if record is None or record.scraped_at is None:
            return None
        return self._clock() - record.scraped_at

    # -- listeners ------------------------------------------------------------------------------

    def add_listener(self, listener: FleetListener) -> None:
        """Call `listener(replica_name, change)` after each change other than a dispatch.

        Listeners run synchronously on the writer's call (scraper, forwarder, membership), after the
        state is updated: keep them cheap and do not call back into writers. An exception is logged
        and swallowed so one listener cannot stop fleet updates.
        """
        self._listeners.append(listener)

    def remove_listener(self, listener: FleetListener) -> None:
        self._listeners.remove(listener)

    # -- writers: membership --------------------------------------------------------------------

    def apply(self, desired: Mapping[str, ReplicaSpec]) -> Applied:
        """Make the members exactly `desired` (name -> spec; each spec's `name` must be its key).

        Idempotent: applying the same set again changes nothing and tells no listener. Departures
        are handled first, then joins and changes, each told to listeners as it happens.
        """
        for name, spec in desired.items():
            if spec.name != name:
                raise ValueError(f"desired[{name!r}] is the spec of {spec.name!r}")
        departed = tuple(n for n in self._records if n not in desired)
        for name in departed:
            self._depart(name)
        joined: list[str] = []
        changed: list[str] = []
        now = self._clock()
        for name, spec in desired.items():
            record = self._records.get(name)
            if record is None:
                self._records[name] = ReplicaRecord(spec, self._fleet, now)
                self._states[name] = self._records[name].to_state()
                joined.append(name)
                self._membership_changed()
                self._changed(name, FleetChange.JOINED | self._refresh_phase(name))
            elif record.spec != spec or record.departing:
                changed.append(name)
                self._update(record, spec)
        return Applied(tuple(joined), tuple(changed), departed)

    def drain(self, replica: str) -> bool:
        """Take `replica` out of service (TERMINATING: no new requests, those in flight finish) until
        `undrain`, whatever its source says. KeyError for an unknown name; True if it changed."""
        return self._set_drained(replica, True)

    def undrain(self, replica: str) -> bool:
        """Cancel `drain`: the replica's phase follows its source again. KeyError for an unknown name."""
        return self._set_drained(replica, False)

    # -- writers: forwarder ---------------------------------------------------------------------

    def dispatched(self, replica: str, tokens: int) -> None:
        """kvgate sent `replica` a request of `tokens` tokens (the forwarder's count: prompt + cap).

        Pair every call with exactly one `finished(replica, tokens)` carrying the same `tokens`,
        whatever the outcome (success, error, cancel): call it from a `finally`. Counts never go below
        zero, so an unpaired `finished` cannot hide load, but an unpaired `dispatched` leaks load.
        """
        record = self._records.get(replica)
        if record is not None:
            record.dispatched(tokens)
            self._changed(replica)

    def finished(self, replica: str, tokens: int) -> None:
        """The request counted by `dispatched(replica, tokens)` ended (see `dispatched`). A departing
        replica's last request ending forgets it."""
        record = self._records.get(replica)
        if record is None:
            return
        record.finished(tokens)
        self._changed(replica, FleetChange.RELEASED)
        if record.departing and record.in_flight == 0 and self._records.get(replica) is record:
            self._forget(replica)

    def report_failure(self, replica: str, kind: str) -> None:
        """A failed contact with the replica (forwarder or scraper).

        `kind` is "connect" (refused or unreachable: ejects at once, so a killed replica leaves
        rotation on the first failed contact), "unhealthy" (`/health` said so: ejects at once), or
        any other short name ("timeout", "status_5xx", "broken", "parse", ...) which counts toward
        `eject_after_failures`.
        """
        record = self._records.get(replica)
        if record is None:
            return
        ejected = record.record_failure(self._clock(), kind)
        if ejected:
            log.warning("replica %s ejected after %s", replica, kind)
        self._changed(replica, FleetChange.HEALTH if ejected else None)

    # -- writers: scraper -----------------------------------------------------------------------

    def record_scrape(self, replica: str, metrics: ReplicaMetrics) -> None:
        """A good scrape: fresh numbers, and a success for health."""
        record = self._records.get(replica)
        if record is None:
            return
        now = self._clock()
        adapters_changed, capacity_changed = record.record_metrics(metrics, now)
        change = FleetChange.METRICS
        if record.record_success(now, from_health_check=False):
            change |= FleetChange.HEALTH
        if capacity_changed:
            change |= FleetChange.CAPACITY
        if adapters_changed:
            change |= FleetChange.MODELS
            self._models = self._build_models()
        if record.ready_since is not None and now - record.ready_since >= record.spec.slow_start_s:
            record.ready_since = None  # ramped up: filters need not look at it any more
        self._changed(replica, change)

    def record_health(self, replica: str, ok: bool) -> None:
        """A `/health` answer: ok = 200. Not ok (any other status) ejects at once; a network failure
        of the check itself goes to `report_failure` with its own kind instead."""
        if not ok:
            self.report_failure(replica, "unhealthy")
            return
        record = self._records.get(replica)
        if record is None:
            return
        readmitted = record.record_success(self._clock(), from_health_check=True)
        if readmitted:
            log.info("replica %s back in rotation", replica)
        self._changed(replica, FleetChange.HEALTH if readmitted else None)

    def record_models(self, replica: str, served: ServedModels) -> None:
        """A good `/v1/models` poll (not a health signal: the scrape and health check judge that).
        It may admit a replica that was waiting for its model, or name the pool of one whose model
        its source did not say."""
        record = self._records.get(replica)
        if record is None:
            return
        pool = record.pool
        if not record.record_served(served):
            return
        change = FleetChange.MODELS
        if record.pool != pool:
            change |= FleetChange.POOL
            self._membership_changed()
        self._models = self._build_models()
        self._changed(replica, change | self._refresh_phase(replica))

    # -- internals ------------------------------------------------------------------------------

    def _update(self, record: ReplicaRecord, spec: ReplicaSpec) -> None:
        name = record.name
        old_url, old_pool = record.url, record.pool
        record.departing = False
        record.set_spec(spec)
        change = FleetChange(0)
        if record.url != old_url:
            change |= FleetChange.RESET | FleetChange.HEALTH | FleetChange.MODELS
            log.info("replica %s moved to %s: it starts over", name, record.url)
        if record.pool != old_pool:
            change |= FleetChange.POOL
        if change & (FleetChange.POOL | FleetChange.MODELS):
            self._membership_changed()  # pools, and the adapters the pool serves, may differ now
        self._changed(name, change | self._refresh_phase(name))

    def _depart(self, name: str) -> None:
        record = self._records[name]
        if record.in_flight == 0:
            self._changed(name, FleetChange.DEPARTED)
            self._forget(name)
            return
        if not record.departing:
            record.departing = True
            log.info("replica %s left its source; %d requests still on it", name, record.in_flight)
            self._changed(name, FleetChange.DEPARTED | self._refresh_phase(name))

    def _forget(self, name: str) -> None:
        del self._records[name]
        del self._states[name]
        self._dirty.discard(name)
        self._membership_changed()
        self._version += 1
        self._notify(name, FleetChange.LEFT)

    def _set_drained(self, replica: str, drained: bool) -> bool:
        record = self._records[replica]
        if record.drained == drained:
            return False
        record.drained = drained
        log.info("replica %s %s", replica, "drained" if drained else "back from drain")
        self._changed(replica, self._refresh_phase(replica))
        return True

    def _refresh_phase(self, name: str) -> FleetChange:
        """Recompute the member's phase; PHASE when it changed (then pool peers may change too)."""
        record = self._records[name]
        peer_ready = any(
            r is not record and r.pool == record.pool and r.phase is ReplicaPhase.READY
            for r in self._records.values()
        )
        if not record.update_phase(self._clock(), peer_ready):
            return FleetChange(0)
        log.info("replica %s is %s", name, record.phase.value)
        return FleetChange.PHASE

    def _membership_changed(self) -> None:
        self._membership_version += 1
        self._reshaped = True
        self._pools = frozenset(r.pool for r in self._records.values() if r.pool)
        self._models = self._build_models()

    def _changed(self, name: str, change: FleetChange | None = None) -> None:
        self._dirty.add(name)
        self._version += 1
        if change:
            self._notify(name, change)

    def _notify(self, name: str, change: FleetChange) -> None:
        for listener in tuple(self._listeners):
            try:
                listener(name, change)
            except Exception:
                log.exception("fleet listener %r failed on %s (%s)", listener, name, change)

    def _build_models(self) -> FleetModels:
        records = self._records.values()
        pools = tuple(dict.fromkeys(r.pool for r in records if r.pool))
        adapters: dict[str, str] = {}
        for record in records:
            if record.pool:
                for adapter in sorted(record.adapters):
                    adapters.setdefault(adapter, record.pool)
        return FleetModels(base_models=pools, adapters=MappingProxyType(adapters))
