"""`queue-depth`: fewer waiting and in-flight requests is better, min-max normalized."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.scheduling.context import SchedulingContext
from policies.scheduling.scorers.min_max import inverted_min_max
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class QueueDepthScorer:
    """(max_load - load) / (max_load - min_load) over the candidates; 1.0 for all when loads are equal.

    Load is `waiting + in_flight` in requests (the replica's scraped queue plus this gateway's live
    count). Normalizing across candidates makes the least-loaded replica score 1 and the most loaded 0
    whatever the absolute numbers, so the weight alone says how much load matters against affinity.
    """

    name: str = "queue-depth"

    def score(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[float]:
        loads = [r.waiting + r.in_flight for r in candidates]
        return inverted_min_max(loads)

