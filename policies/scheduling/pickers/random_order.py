"""`random`: a uniformly random order, scores ignored (a baseline for benchmarks)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class RandomPicker:
    """A shuffle of the candidates drawn from `rng`; `totals` are ignored."""

    name: str = "random"

    def pick(
        self,
        ctx: SchedulingContext,
        candidates: Sequence[ReplicaState],
        totals: Sequence[float],
        rng: random.Random,
    ) -> list[ReplicaState]:
        order = list(candidates)
        rng.shuffle(order)
        return order
