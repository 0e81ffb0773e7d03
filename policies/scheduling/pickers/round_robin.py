"""`round-robin`: rotate through the candidates by the gateway's request counter."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class RoundRobinPicker:
    """Candidates rotated to start at index `ctx.sequence % len(candidates)`, then in order.

    Stateless: the rotation comes from `ctx.sequence`, which the gateway increments per request, so
    consecutive requests over the same candidates start at consecutive replicas. `totals` and `rng`
    are ignored.
    """

    name: str = "round-robin"

    def pick(
        self,
        ctx: SchedulingContext,
        candidates: Sequence[ReplicaState],
        totals: Sequence[float],
        rng: random.Random,
    ) -> list[ReplicaState]:
        if not candidates:
            return []
        start = ctx.sequence % len(candidates)
        return [*candidates[start:], *candidates[:start]]
