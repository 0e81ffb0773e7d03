"""`serves-model`: drop replicas of another model pool. Hard."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class ServesModelFilter:
    """Keeps replicas whose `pool` is the request's `base_model`."""

    name: str = "serves-model"
    soft: ClassVar[bool] = False

    def filter(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[ReplicaState]:
        model = ctx.request.base_model
        for r in candidates:
            if r.pool != model:
                return [r for r in candidates if r.pool == model]
        return candidates  # the common case: the pool's replicas only, nothing to copy
