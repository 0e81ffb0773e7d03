"""Is the fleet (one pool) too busy to take another request right now?

While a pool is saturated, the gateway holds requests in its fair queue instead of sending them to
replicas that would only queue or preempt them. A replica counts as saturated when any of these holds:

- it is out of service (not ready, or terminating: `ReplicaState.in_service`);
- it is unhealthy (ejected or failing health checks);
- its metrics are stale or it was never scraped (`now - scraped_at > stale_after_s`): the gateway
  cannot see it, so it does not pile work onto it blind;
- its engine queue is longer than tolerated: `waiting > max_waiting_per_replica` (0 = no queue at all);
- its KV cache is nearly full: `kv_usage >= max_kv_usage`;
- the gateway already has `max_in_flight_per_replica` requests on it: `in_flight >= max_in_flight`
  (live between scrapes, so a burst is caught before the next scrape shows it).

A pool is saturated when every replica in it is (a pool with no replicas is saturated): the admission
queue sums `replica_headroom` over a pool's replicas (gateway/admission_pools).
Pure: `now` is the caller's monotonic clock, the same one `ReplicaState.scraped_at` uses.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class SaturationThresholds:
    """`max_waiting_per_replica` >= 0 requests tolerated in a replica's engine queue;
    `max_kv_usage` in (0, 1]; `max_in_flight_per_replica` >= 1 gateway requests per replica;
    `stale_after_s` > 0 seconds since the last good scrape."""

    max_waiting_per_replica: int
    max_kv_usage: float
    max_in_flight_per_replica: int
    stale_after_s: float

    def __post_init__(self) -> None:
        if self.max_waiting_per_replica < 0:
            raise ValueError("max_waiting_per_replica must be >= 0")
        if not 0 < self.max_kv_usage <= 1:
            raise ValueError("max_kv_usage must be in (0, 1]")
        if self.max_in_flight_per_replica < 1:
            raise ValueError("max_in_flight_per_replica must be >= 1")
        if not (self.stale_after_s > 0 and math.isfinite(self.stale_after_s)):
            raise ValueError("stale_after_s must be a positive finite number of seconds")


class SaturationReason(enum.Enum):
    """Why a replica takes no more work; `value` is a metric label."""

    OUT_OF_SERVICE = "out_of_service"
    UNHEALTHY = "unhealthy"
    STALE = "stale"
    WAITING = "waiting"
    KV_USAGE = "kv_usage"
    IN_FLIGHT = "in_flight"


def saturation_reason(r: ReplicaState, thr: SaturationThresholds, now: float) -> SaturationReason | None:
    """The first rule (in the order of the module docstring) that makes `r` saturated, or None."""
    if not r.in_service:
        return SaturationReason.OUT_OF_SERVICE
    if not r.healthy:
        return SaturationReason.UNHEALTHY
    if not r.is_fresh(now, thr.stale_after_s):
        return SaturationReason.STALE
    if r.waiting > thr.max_waiting_per_replica:
        return SaturationReason.WAITING
    if r.kv_usage >= thr.max_kv_usage:
        return SaturationReason.KV_USAGE
    if r.in_flight >= thr.max_in_flight_per_replica:
        return SaturationReason.IN_FLIGHT
    return None


def replica_headroom(r: ReplicaState, thr: SaturationThresholds, now: float) -> int:
    """Requests that can still be sent to `r` before it counts as saturated, counting the one that
    tips it over: 0 if saturated, else >= 1. Assumes each request sent may join the engine queue
    (conservative for `waiting`); KV usage gives no count, it only gates."""
    if saturation_reason(r, thr, now) is not None:
        return 0
    return min(thr.max_in_flight_per_replica - r.in_flight, thr.max_waiting_per_replica + 1 - r.waiting)
