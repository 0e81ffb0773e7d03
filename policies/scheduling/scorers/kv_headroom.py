"""`kv-headroom`: more free KV cache is better."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class KvHeadroomScorer:
    """`1 - kv_usage` (kv_usage is a fraction in [0, 1]; out-of-range values are clamped by the profile).

    vLLM counts cached-but-unused blocks as free, so headroom does not punish a warm prefix cache.
    """

    name: str = "kv-headroom"

    def score(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[float]:
        return [1.0 - r.kv_usage for r in candidates]
