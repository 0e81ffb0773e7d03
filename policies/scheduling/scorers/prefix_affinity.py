"""`prefix-affinity`: share of the prompt's leading blocks a replica is believed to hold."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class PrefixAffinityScorer:
    """`ctx.prefix_match[name] / ctx.prefix_blocks`; 0 for every replica when the prompt has no blocks.

    On its own it herds a hot prefix onto one replica; pair it with `queue-depth` and `load-guard`.
    """

    name: str = "prefix-affinity"

    def score(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[float]:
        blocks = ctx.prefix_blocks
        if blocks <= 0 or not ctx.prefix_match:  # a cold prompt: nobody holds its first block
            return [0.0] * len(candidates)
        get = ctx.prefix_match.get
        return [get(r.name, 0) / blocks for r in candidates]
