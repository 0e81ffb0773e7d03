"""FleetState: the gateway's one live picture of its replicas, and the frozen snapshots taken from it.

Writers: the scraper (`record_scrape`, `record_health`, `record_models`, `report_failure`) and the
forwarder (`dispatched`, `finished`, `report_failure`). Readers: the request path (`snapshot`,
`pool_of`), the models endpoint (`models`), the prefix index (`kv_capacity_tokens`, listeners).
Everything runs on the event loop thread; nothing here blocks or awaits, and nothing is locked.

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
from gateway.fleet.metrics_parse import ReplicaMetrics
from gateway.fleet.models_parse import ServedModels
from gateway.fleet.replica import ReplicaRecord
from policies.types import FleetSnapshot

log = logging.getLogger(__name__)


class FleetChange(enum.Flag):
    """What changed on a replica, as listeners are told (several flags may come at once)."""

    METRICS = enum.auto()  # a good scrape brought fresh numbers
    HEALTH = enum.auto()  # ejected, or back in rotation
    MODELS = enum.auto()  # the adapters or base models it serves changed
    CAPACITY = enum.auto()  # its KV capacity (block size x blocks) changed, first scrape included
    RELEASED = enum.auto()  # a request kvgate sent it finished (in-flight went down)


FleetListener = Callable[[str, FleetChange], None]


@dataclass(frozen=True, slots=True)
class FleetModels:
    """The fleet's model names: pools (config order) and adapters -> the pool whose replicas serve them.

    An adapter served in two pools resolves to the first pool in config order.
    """

    base_models: tuple[str, ...]
    adapters: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


class FleetState:
    """Live state of the configured replicas (config order, names unique as the config guarantees).

    Methods taking a replica name raise KeyError for a name that is not configured.
    """

    def __init__(
        self,
        replicas: Sequence[ReplicaConfig],
        fleet: FleetConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._fleet = fleet
        now = clock()
        self._configs = tuple(replicas)
        self._records = tuple(ReplicaRecord(r, fleet, now) for r in self._configs)
        self._index = {r.name: i for i, r in enumerate(self._records)}
        if len(self._index) != len(self._records):
            raise ValueError("replica names must be unique")
        self._pools = frozenset(r.pool for r in self._records)
        self._states = [r.to_state() for r in self._records]
        self._dirty: set[int] = set()
        self._snapshot = FleetSnapshot(tuple(self._states), now)
        self._listeners: list[FleetListener] = []
        self._version = 0
        self._models = self._build_models()

    # -- reading --------------------------------------------------------------------------------

    @property
    def replicas(self) -> tuple[ReplicaConfig, ...]:
        """The replicas' configs, in config order."""
        return self._configs

    @property
    def version(self) -> int:
        """Grows by one or more on every change (scrape, health, models, in-flight). Never shrinks."""
        return self._version

    def snapshot(self) -> FleetSnapshot:
        """The current frozen picture; the same object until something changes (see module doc)."""
        if self._dirty:
            for i in self._dirty:
                self._states[i] = self._records[i].to_state()
            self._dirty.clear()
            self._snapshot = FleetSnapshot(tuple(self._states), self._clock())
        return self._snapshot

    def models(self) -> FleetModels:
        """Pools and adapters the fleet serves (cached; rebuilt when a replica's adapters change)."""
        return self._models

    def pool_of(self, model: str) -> tuple[str, str | None] | None:
        """Resolve a requested `model`: a pool -> (pool, None); an adapter -> (its pool, adapter);
        unknown -> None. A name that is both a pool and an adapter resolves to the pool."""
        if model in self._pools:
            return model, None
        pool = self._models.adapters.get(model)
        return None if pool is None else (pool, model)

    def kv_capacity_tokens(self, replica: str) -> int | None:
        """The replica's KV cache in tokens (block_size x num_gpu_blocks), None until it reports it."""
        return self._record(replica).kv_capacity_tokens

    def scrape_age_s(self, replica: str) -> float | None:
        """Seconds since the replica's last good scrape; None before the first."""
        scraped_at = self._record(replica).scraped_at
        return None if scraped_at is None else self._clock() - scraped_at

    # -- listeners ------------------------------------------------------------------------------

    def add_listener(self, listener: FleetListener) -> None:
        """Call `listener(replica_name, change)` after each change other than a dispatch.

        Listeners run synchronously on the writer's call (scraper or forwarder), after the state is
        updated: keep them cheap and do not call back into writers. An exception is logged and
        swallowed so one listener cannot stop fleet updates.
        """
        self._listeners.append(listener)

    def remove_listener(self, listener: FleetListener) -> None:
        self._listeners.remove(listener)

    # -- writers: forwarder ---------------------------------------------------------------------

    def dispatched(self, replica: str, tokens: int) -> None:
        """kvgate sent `replica` a request of `tokens` tokens (the forwarder's count: prompt + cap).

        Pair every call with exactly one `finished(replica, tokens)` carrying the same `tokens`,
        whatever the outcome (success, error, cancel): call it from a `finally`. Counts never go below
        zero, so an unpaired `finished` cannot hide load, but an unpaired `dispatched` leaks load.
        """
        i = self._index[replica]
        self._records[i].dispatched(tokens)
        self._changed(i)

    def finished(self, replica: str, tokens: int) -> None:
        """The request counted by `dispatched(replica, tokens)` ended (see `dispatched`)."""
        i = self._index[replica]
        self._records[i].finished(tokens)
        self._changed(i, FleetChange.RELEASED)

    def report_failure(self, replica: str, kind: str) -> None:
        """A failed contact with the replica (forwarder or scraper).

        `kind` is "connect" (refused or unreachable: ejects at once, so a killed replica leaves
        rotation on the first failed contact), "unhealthy" (`/health` said so: ejects at once), or
        any other short name ("timeout", "status_5xx", "broken", "parse", ...) which counts toward
        `eject_after_failures`.
        """
        i = self._index[replica]
        ejected = self._records[i].record_failure(self._clock(), kind)
        if ejected:
            log.warning("replica %s ejected after %s", replica, kind)
        self._changed(i, FleetChange.HEALTH if ejected else None)

    # -- writers: scraper -----------------------------------------------------------------------

    def record_scrape(self, replica: str, metrics: ReplicaMetrics) -> None:
        """A good scrape: fresh numbers, and a success for health."""
        i = self._index[replica]
        record = self._records[i]
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
        self._changed(i, change)

    def record_health(self, replica: str, ok: bool) -> None:
        """A `/health` answer: ok = 200. Not ok (any other status) ejects at once; a network failure
        of the check itself goes to `report_failure` with its own kind instead."""
        if not ok:
            self.report_failure(replica, "unhealthy")
            return
        i = self._index[replica]
        readmitted = self._records[i].record_success(self._clock(), from_health_check=True)
        if readmitted:
            log.info("replica %s back in rotation", replica)
        self._changed(i, FleetChange.HEALTH if readmitted else None)

    def record_models(self, replica: str, served: ServedModels) -> None:
        """A good `/v1/models` poll (not a health signal: the scrape and health check judge that)."""
        i = self._index[replica]
        if self._records[i].record_served(served):
            self._models = self._build_models()
            self._changed(i, FleetChange.MODELS)

    # -- internals ------------------------------------------------------------------------------

    def _record(self, replica: str) -> ReplicaRecord:
        return self._records[self._index[replica]]

    def _changed(self, i: int, change: FleetChange | None = None) -> None:
        self._dirty.add(i)
        self._version += 1
        if change is None or not self._listeners:
            return
        name = self._records[i].name
        for listener in tuple(self._listeners):
            try:
                listener(name, change)
            except Exception:
                log.exception("fleet listener %r failed on %s (%s)", listener, name, change)

    def _build_models(self) -> FleetModels:
        pools = tuple(dict.fromkeys(r.pool for r in self._records))
        adapters: dict[str, str] = {}
        for record in self._records:
            for adapter in sorted(record.adapters):
                adapters.setdefault(adapter, record.pool)
        return FleetModels(base_models=pools, adapters=MappingProxyType(adapters))
