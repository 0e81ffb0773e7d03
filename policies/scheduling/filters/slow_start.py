"""`slow-start`: thin out replicas that are still ramping up after becoming ready. Soft."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.scheduling.context import SchedulingContext
from policies.slow_start import DEFAULT_MIN_WEIGHT, keeps, slow_start_weight
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class SlowStartFilter:
    """Keeps a ramping replica (`ready_since` set) for `slow_start_weight(now - ready_since,
    slow_start_s)` of the requests (`policies.slow_start.keeps` on `ctx.sequence`), every other
    replica always. The ramp length is the replica's own (`ReplicaState.slow_start_s`, from the
    discovery config), so this filter has only `min_weight` (in (0, 1]).

    Soft: a pool whose only candidates are ramping still serves.
    """

    name: str = "slow-start"
    min_weight: float = DEFAULT_MIN_WEIGHT
    soft: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not 0.0 < self.min_weight <= 1.0:
            raise ValueError(f"min_weight must be in (0, 1], got {self.min_weight}")

    def filter(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[ReplicaState]:
        for r in candidates:
            if r.ready_since is not None:
                break
        else:
            return candidates  # the common case: nobody ramps, nothing to copy
        now, seq, floor = ctx.now, ctx.sequence, self.min_weight
        return [
            r
            for r in candidates
            if r.ready_since is None
            or keeps(seq, r.name, slow_start_weight(now - r.ready_since, r.slow_start_s, floor))
        ]
