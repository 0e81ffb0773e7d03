"""`load-guard`: drop replicas far more loaded than the least-loaded candidate. Soft.

This is the explicit anti-herding guard. Prefix affinity pulls every request of a hot prefix to the
replica that holds it; the weighted load scorers push back, but a full prefix hit can outweigh them
(by design: a cache hit is worth some queueing). The guard bounds how much: once the holder's load
exceeds the least-loaded candidate's by more than the slack, it is not a candidate at all, so the next
requests of that prefix go elsewhere (and warm a second replica) before its queue explodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class LoadGuardFilter:
    """Keeps replicas with load <= min_load + max(abs_slack, rel_slack * min_load).

    Load is `waiting + in_flight` (requests: the replica's queue from the last scrape plus what this
    gateway has sent and not yet seen finish). `abs_slack` >= 0 (requests), `rel_slack` >= 0 (a
    fraction of the minimum load). The least-loaded candidate always passes, so the guard never empties
    the set; it is soft anyway.
    """

    name: str = "load-guard"
    abs_slack: float = 8.0
    rel_slack: float = 0.5
    soft: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.abs_slack < 0 or self.rel_slack < 0:
            raise ValueError(f"abs_slack and rel_slack must be >= 0, got {self.abs_slack}, {self.rel_slack}")

    def filter(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[ReplicaState]:
        if len(candidates) < 2:
            return candidates
        loads = [r.waiting + r.in_flight for r in candidates]
        least = min(loads)
        limit = least + max(self.abs_slack, self.rel_slack * least)
        if max(loads) <= limit:
            return candidates
        return [r for r, load in zip(candidates, loads) if load <= limit]  # noqa: B905 - same length
