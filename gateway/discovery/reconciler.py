"""Reconciler: merges the static list and every discovery source's latest word into one desired set,
and applies it to `FleetState`.

Each source hands over its whole current set on every change (`update`), never a delta, so a lost
event cannot leave a replica behind: the next full set corrects it. A source that fails (`failed`)
keeps its last good set: an API server outage or a half-written file must not empty the fleet; it
only grows the source's age, which `/ready` and `kvgate_discovery_age_seconds` show.

Precedence on a name given by two sources: the static list first, then sources in the order they
were registered (`Discovery` registers file, kubernetes, dns); the loser is ignored and logged once.

Single event loop; nothing here awaits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.fleet.membership import STATIC_SOURCE, ReplicaSpec
from gateway.fleet.state import Applied, FleetState

log = logging.getLogger(__name__)

_EMPTY: Mapping[str, ReplicaSpec] = MappingProxyType({})


@dataclass(slots=True)
class SourceStatus:
    """One source's record: its last good set, when it was last in sync, and its failures."""

    name: str
    desired: Mapping[str, ReplicaSpec] = field(default_factory=lambda: _EMPTY)
    last_success: float | None = None  # clock reading of the last good sync; None: never
    errors: int = 0  # failed syncs since start
    last_error: str | None = None  # None after a good sync


class Reconciler:
    """The one writer of `FleetState.apply` (graceful reload replaces the static list through it)."""

    def __init__(
        self, fleet: FleetState, static: Iterable[ReplicaSpec] = (), clock: Callable[[], float] | None = None
    ) -> None:
        self._fleet = fleet
        self._clock = clock or time.monotonic
        self._static: Mapping[str, ReplicaSpec] = {s.name: s for s in static}
        self._sources: dict[str, SourceStatus] = {}
        self._shadowed: set[tuple[str, str]] = set()  # (source, name) already logged as ignored

    # -- sources --------------------------------------------------------------------------------

    def register(self, source: str) -> None:
        """A source that will report; it has no replicas and counts as never synced until it does.
        Registering a known source again keeps its set (a source replaced on reload)."""
        if source == STATIC_SOURCE:
            raise ValueError(f"{STATIC_SOURCE!r} is the static list's name")
        self._sources.setdefault(source, SourceStatus(source))

    def unregister(self, source: str) -> Applied:
        """Forget a source and its replicas (they depart the fleet unless another source has them)."""
        self._sources.pop(source, None)
        return self.reconcile()

    def update(self, source: str, desired: Mapping[str, ReplicaSpec]) -> Applied:
        """`source` is in sync and says the replicas are exactly `desired` (name -> spec)."""
        status = self._sources[source]
        status.desired = MappingProxyType(dict(desired))
        status.last_success = self._clock()
        status.last_error = None
        return self.reconcile()

    def touch(self, source: str) -> None:
        """`source` is in sync and nothing changed (a bookmark, an unchanged file)."""
        status = self._sources[source]
        status.last_success = self._clock()
        status.last_error = None

    def failed(self, source: str, error: str) -> None:
        """A sync of `source` failed; its last good set stays (see the module doc)."""
        status = self._sources[source]
        status.errors += 1
        if status.last_error != error:
            log.warning(
                "discovery %s: %s (keeping its last good list of %d)", source, error, len(status.desired)
            )
        status.last_error = error

    def set_static(self, static: Iterable[ReplicaSpec]) -> Applied:
        """Replace the static list (a reload) and reconcile."""
        self._static = {s.name: s for s in static}
        return self.reconcile()

    # -- reading --------------------------------------------------------------------------------

    def statuses(self) -> tuple[SourceStatus, ...]:
        return tuple(self._sources.values())

    def age_s(self, source: str) -> float | None:
        """Seconds since `source` was last in sync; None if it never was."""
        last = self._sources[source].last_success
        return None if last is None else self._clock() - last

    def stale(self, stale_after_s: float) -> list[str]:
        """Sources not in sync for more than `stale_after_s` seconds, or never."""
        return [
            s.name
            for s in self._sources.values()
            if s.last_success is None or self._clock() - s.last_success > stale_after_s
        ]

    # -- applying -------------------------------------------------------------------------------

    def desired(self) -> dict[str, ReplicaSpec]:
        """The merged set (static list first, then sources in registration order)."""
        merged: dict[str, ReplicaSpec] = dict(self._static)
        for status in self._sources.values():
            for name, spec in status.desired.items():
                if name not in merged:
                    merged[name] = spec
                elif (status.name, name) not in self._shadowed:
                    self._shadowed.add((status.name, name))
                    log.warning(
                        "discovery %s: replica %s is also given by %s, which takes precedence",
                        status.name, name, merged[name].source,
                    )  # fmt: skip
        return merged

    def reconcile(self) -> Applied:
        applied = self._fleet.apply(self.desired())
        if applied.joined or applied.departed:
            log.info(
                "fleet: joined %s, departed %s",
                ", ".join(applied.joined) or "-",
                ", ".join(applied.departed) or "-",
            )
        return applied
