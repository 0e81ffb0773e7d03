"""`session-affinity`: the replica that served this session's previous request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class SessionAffinityScorer:
    """1.0 for `ctx.session_replica`, 0 for every other replica (and for all when there is none)."""

    name: str = "session-affinity"

    def score(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[float]:
        target = ctx.session_replica
        if target is None:
            return [0.0] * len(candidates)
        return [1.0 if r.name == target else 0.0 for r in candidates]
