"""One replica's live record: its last scrape, its health, what it serves, and kvgate's in-flight counts.

Owned by `FleetState` and mutated only through it, from the event loop thread (no locking). Health is
a small circuit breaker:

- a failure adds to `consecutive_failures`; the replica is ejected when that reaches
  `eject_after_failures`, or at once for a hard failure (connection refused; `/health` answering
  non-200: the replica itself says it cannot serve);
- an ejection lasts `eject_backoff_s * 2**k` seconds, capped at `eject_backoff_max_s`, where k counts
  the ejections since the replica was last forgiven (k resets after `eject_backoff_max_s` in rotation);
- after its backoff the replica re-enters only on a success (a good scrape or health check), and not
  while its last health check said unhealthy; a failure after the backoff expired ejects it again
  with the next, longer backoff (the probe failed);
- a success resets `consecutive_failures`.

Membership (`gateway.fleet.membership`): the record holds its source's `ReplicaSpec`, whether kvgate
drained it (admin) and whether it is departing (left its source with requests in flight); its
`phase` follows from those and from its `/v1/models` (`effective_phase`).
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config import FleetConfig
from gateway.fleet.membership import ReplicaSpec, effective_phase
from gateway.fleet.metrics_parse import ReplicaMetrics
from gateway.fleet.models_parse import ServedModels
from policies.types import ReplicaPhase, ReplicaState

# Failure kinds that eject at once. Others ("timeout", "status_5xx", "broken", "parse", ...) count
# toward `eject_after_failures`.
HARD_FAILURES = frozenset({"connect", "unhealthy"})
_MAX_DOUBLINGS = 62  # 2**62 seconds is beyond any cap; keeps the float exponent bounded
_UNSCRAPED = ReplicaMetrics(running=0, waiting=0, kv_usage=0.0)  # stands in until the first scrape


class ReplicaRecord:
    """Mutable record of one replica. Times are seconds on `FleetState`'s clock."""

    __slots__ = (
        "_fleet",
        "adapters",
        "consecutive_failures",
        "departing",
        "drained",
        "ejected_until",
        "ejections",
        "health_says_unhealthy",
        "in_flight",
        "in_flight_at_scrape",
        "in_flight_tokens",
        "in_rotation_since",
        "labels",
        "metrics",
        "name",
        "phase",
        "pool",
        "ready_since",
        "scraped_at",
        "served",
        "spec",
        "url",
    )

    def __init__(self, spec: ReplicaSpec, fleet: FleetConfig, now: float) -> None:
        self._fleet = fleet
        self.spec = spec
        self.name = spec.name
        self.url = spec.url
        self.pool = spec.model or ""  # "" until /v1/models names it (spec.model None)
        self.labels: Mapping[str, str] = spec.labels
        self.drained = False  # kvgate's own decision (admin API): no new requests
        self.departing = False  # left its source; forgotten when its last request finishes
        self.phase = ReplicaPhase.NOT_READY
        self.ready_since: float | None = None  # set while it ramps up (slow start)
        self.metrics: ReplicaMetrics | None = None
        self.scraped_at: float | None = None
        self.served: ServedModels | None = None
        self.adapters: frozenset[str] = frozenset()  # from /v1/models and lora_requests_info
        self.in_flight = 0  # requests kvgate sent and that have not finished
        self.in_flight_tokens = 0  # their tokens, as the forwarder counted them at dispatch
        self.in_flight_at_scrape = 0  # in_flight when the last scrape was recorded
        self.consecutive_failures = 0
        self.ejections = 0  # ejections since last forgiven; the backoff's exponent
        self.ejected_until: float | None = None  # None: in rotation
        self.in_rotation_since: float = now
        self.health_says_unhealthy = False

    # -- membership -----------------------------------------------------------------------------

    def set_spec(self, spec: ReplicaSpec) -> None:
        """Its source's new word. A new URL is a new process: scrape, health and served models start
        over (the caller also forgets its cache picture); a new model moves it to that pool."""
        if spec.url != self.url:
            self.url = spec.url
            self.metrics = None
            self.scraped_at = None
            self.served = None
            self.adapters = frozenset()
            self.consecutive_failures = 0
            self.ejections = 0
            self.ejected_until = None
            self.health_says_unhealthy = False
        self.spec = spec
        self.labels = spec.labels
        self.pool = self._pool_now()

    def update_phase(self, now: float, pool_has_ready_peer: bool) -> bool:
        """Recompute `phase`; True when it changed. Becoming READY while another replica of its pool
        is READY starts its slow-start ramp (alone in its pool there is nobody to share with)."""
        phase = effective_phase(
            self.spec.phase,
            departing=self.departing,
            drained=self.drained,
            awaiting_model=self.spec.await_model and not self.model_listed(),
        )
        if self.pool == "" and phase is ReplicaPhase.READY:
            phase = ReplicaPhase.NOT_READY  # its model is not known yet: it is in no pool
        if phase is self.phase:
            return False
        self.phase = phase
        ramps = phase is ReplicaPhase.READY and pool_has_ready_peer and self.spec.slow_start_s > 0
        self.ready_since = now if ramps else None
        return True

    def model_listed(self) -> bool:
        """Its last good `/v1/models` lists its pool's model."""
        return self.served is not None and self.pool != "" and self.pool in self.served.base_models

    def _pool_now(self) -> str:
        if self.spec.model is not None:
            return self.spec.model
        if self.served is not None and self.served.base_models:
            return self.served.base_models[0]
        return ""

    @property
    def ejected(self) -> bool:
        return self.ejected_until is not None

    @property
    def kv_capacity_tokens(self) -> int | None:
        return None if self.metrics is None else self.metrics.kv_capacity_tokens

    # -- health ---------------------------------------------------------------------------------

    def record_success(self, now: float, *, from_health_check: bool) -> bool:
        """A good scrape or health check. Returns True when the replica re-entered rotation."""
        self.consecutive_failures = 0
        if from_health_check:
            self.health_says_unhealthy = False
        if self.ejected_until is None:
            if self.ejections and now - self.in_rotation_since >= self._fleet.eject_backoff_max_s:
                self.ejections = 0
            return False
        if now < self.ejected_until or self.health_says_unhealthy:
            return False
        self.ejected_until = None
        self.in_rotation_since = now
        return True

    def record_failure(self, now: float, kind: str) -> bool:
        """A failed scrape, health check or forwarded request. Returns True when newly ejected."""
        self.consecutive_failures += 1
        if kind == "unhealthy":
            self.health_says_unhealthy = True
        if self.ejected_until is not None:
            if now >= self.ejected_until:
                self._eject(now)  # the first probe after the backoff failed: back off longer
            return False
        if kind in HARD_FAILURES or self.consecutive_failures >= self._fleet.eject_after_failures:
            self._eject(now)
            return True
        return False

    def _eject(self, now: float) -> None:
        backoff = self._fleet.eject_backoff_s * 2.0 ** min(self.ejections, _MAX_DOUBLINGS)
        self.ejected_until = now + min(backoff, self._fleet.eject_backoff_max_s)
        self.ejections += 1

    # -- scrape and models ----------------------------------------------------------------------

    def record_metrics(self, metrics: ReplicaMetrics, now: float) -> tuple[bool, bool]:
        """A good scrape's numbers. Returns (adapters changed, KV capacity changed)."""
        old_capacity = self.kv_capacity_tokens
        self.metrics = metrics
        self.scraped_at = now
        self.in_flight_at_scrape = self.in_flight
        return self._refresh_adapters(), old_capacity != metrics.kv_capacity_tokens

    def record_served(self, served: ServedModels) -> bool:
        """A good `/v1/models` poll. Returns True when the adapters or base models changed."""
        changed = self.served != served
        self.served = served
        self.pool = self._pool_now()
        return self._refresh_adapters() or changed

    def _refresh_adapters(self) -> bool:
        adapters: set[str] = set()
        if self.served is not None:
            adapters.update(self.served.adapters)
        if self.metrics is not None:
            adapters.update(self.metrics.running_adapters)
            adapters.update(self.metrics.waiting_adapters)
        if adapters == self.adapters:
            return False
        self.adapters = frozenset(adapters)
        return True

    # -- in-flight ------------------------------------------------------------------------------

    def dispatched(self, tokens: int) -> None:
        self.in_flight += 1
        self.in_flight_tokens += max(tokens, 0)

    def finished(self, tokens: int) -> None:
        # Clamped: a stray extra `finished` must not make a replica look emptier than idle.
        self.in_flight = max(self.in_flight - 1, 0)
        self.in_flight_tokens = max(self.in_flight_tokens - max(tokens, 0), 0)

    # -- the frozen view ------------------------------------------------------------------------

    def to_state(self) -> ReplicaState:
        m = self.metrics or _UNSCRAPED
        return ReplicaState(
            name=self.name,
            url=self.url,
            pool=self.pool,
            healthy=self.ejected_until is None,
            scraped_at=self.scraped_at,
            running=m.running,
            waiting=m.waiting,
            kv_usage=m.kv_usage,
            in_flight=self.in_flight,
            in_flight_tokens=self.in_flight_tokens,
            in_flight_at_scrape=self.in_flight_at_scrape,
            block_size=m.block_size or 16,  # ReplicaState's default; capacity stays 0 while unknown
            num_gpu_blocks=m.num_gpu_blocks or 0,
            max_loras=m.max_loras or 0,
            adapters=self.adapters,
            active_adapters=frozenset(m.running_adapters),
            labels=self.labels,
            phase=self.phase,
            ready_since=self.ready_since,
            slow_start_s=self.spec.slow_start_s,
        )
