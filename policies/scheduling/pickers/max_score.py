"""`max-score`: highest weighted total first, ties broken at random."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class MaxScorePicker:
    """All candidates by descending total; equal totals in an order drawn from `rng`.

    Draws one `rng.random()` per candidate (none for a single candidate), so a seeded `rng` gives the
    same order for the same inputs. Totals are compared exactly: equal inputs give equal floats.
    """

    name: str = "max-score"

    def pick(
        self,
        ctx: SchedulingContext,
        candidates: Sequence[ReplicaState],
        totals: Sequence[float],
        rng: random.Random,
    ) -> list[ReplicaState]:
        count = len(candidates)
        if count < 2:
            return list(candidates)
        draw = rng.random
        tiebreak = [draw() for _ in range(count)]
        order = sorted(zip(totals, tiebreak, range(count), strict=True), reverse=True)
        return [candidates[i] for _, _, i in order]
