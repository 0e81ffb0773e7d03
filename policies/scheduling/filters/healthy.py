"""`healthy`: drop replicas the health checker has ejected. Hard."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class HealthyFilter:
    """Keeps replicas with `healthy` set; an unhealthy replica can never serve."""

    name: str = "healthy"
    soft: ClassVar[bool] = False

    def filter(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[ReplicaState]:
        for r in candidates:
            if not r.healthy:
                return [r for r in candidates if r.healthy]
        return candidates  # the common case: everyone is healthy, nothing to copy
