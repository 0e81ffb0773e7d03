"""`in-flight-cap`: drop replicas already holding as many requests as flow control allows one. Soft.

Flow control (gateway/admission.py) admits a request while its POOL has room: the sum, over the
pool's replicas, of what each may still take (`flow_control.saturation.max_in_flight_per_replica`
among the limits). Scheduling then picks ONE replica, and prefix affinity pulls a shared prompt to the
replica that holds it whatever its load: without this filter, six concurrent requests of one prefix
all went to that replica under a cap of one, while the other replica had room. This filter is what
makes the per-replica cap a cap: a replica at it is not a candidate while another is below it.

The cap comes from the gateway (`SchedulingContext.max_in_flight_per_replica`; None: flow control
is off, no cap, nothing dropped). Load is `in_flight`, kvgate's own live count of what it sent the
replica and has not seen finish. Soft: when every candidate is at the cap (flow control let the
request through on a stale picture), the profile serves it anyway rather than refusing it here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class InFlightCapFilter:
    """Keeps replicas with `in_flight < ctx.max_in_flight_per_replica` (all of them when it is None)."""

    name: str = "in-flight-cap"
    soft: ClassVar[bool] = True

    def filter(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[ReplicaState]:
        cap = ctx.max_in_flight_per_replica
        if cap is None or all(r.in_flight < cap for r in candidates):
            return candidates
        return [r for r in candidates if r.in_flight < cap]
