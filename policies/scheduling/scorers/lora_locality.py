"""`lora-locality`: an adapter already active beats a free adapter slot beats neither."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState

ACTIVE = 1.0
FREE_SLOT = 0.5
NEITHER = 0.0


@dataclass(frozen=True, slots=True)
class LoraLocalityScorer:
    """1.0 when the adapter is active (in the running batch) on the replica; 0.5 when the replica has
    it loaded and a free adapter slot (`len(active_adapters) < max_loras`, or `max_loras` unknown = 0);
    0 otherwise. 1.0 for every replica when the request has no adapter, so the scorer is neutral then.

    A request whose adapter is not in the batch waits for a slot in vLLM (`--max-loras` caps distinct
    adapters per batch), so an active adapter means no wait and no swap.
    """

    name: str = "lora-locality"

    def score(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[float]:
        adapter = ctx.request.adapter
        if adapter is None:
            return [ACTIVE] * len(candidates)
        return [_locality(r, adapter) for r in candidates]


def _locality(replica: ReplicaState, adapter: str) -> float:
    if adapter in replica.active_adapters:
        return ACTIVE
    if adapter in replica.adapters and (
        replica.max_loras == 0 or len(replica.active_adapters) < replica.max_loras
    ):
        return FREE_SLOT
    return NEITHER
