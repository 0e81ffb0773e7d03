"""`predicted-latency`: the least predicted time to first token wins; prefix affinity is its saving.

Each candidate's TTFT is predicted by its own calibrated model (`policies.latency`): the uncached
prefill ahead of the request there plus its own uncached prompt (the prompt minus the prefix the
index believes the replica holds), in seconds at that replica's rate. A replica that holds 60% of a
conversation keeps it against a peer with one more short request in flight, because re-prefilling
the 60% elsewhere costs more than the wait; it loses it when the queue there truly costs more.

Cost = predicted TTFT + `work_weight` x the seconds its own uncached prefill takes there. The second
term is what the choice costs the requests that come after it: re-prefilling a conversation on an
idle replica may shave this request's TTFT, but it spends that replica's compute on tokens the old
one already held, and the next turn finds its prefix where it went. With `work_weight` 0 the cost is
the TTFT alone. Score = best cost / the candidate's (1 for the best, 0.5 for one twice as costly):
a ratio, so the picker's margin is a share of the cost, and replicas of different speeds compare in
seconds.
With `tpot_slo_s` > 0, a candidate whose predicted time per output token is over it scores 0 unless
every candidate is over it. Without latency models in the context every candidate scores 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class PredictedLatencyScorer:
    """Best predicted cost / the candidate's (module docstring); `tpot_slo_s` 0 means no TPOT bound;
    `work_weight` (>= 0) prices the candidate's own uncached prefill beside the TTFT."""

    name: str = "predicted-latency"
    tpot_slo_s: float = 0.0
    work_weight: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tpot_slo_s) and self.tpot_slo_s >= 0):
            raise ValueError(f"tpot_slo_s must be finite and >= 0, got {self.tpot_slo_s}")
        if not (math.isfinite(self.work_weight) and self.work_weight >= 0):
            raise ValueError(f"work_weight must be finite and >= 0, got {self.work_weight}")

    def score(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[float]:
        est = ctx.latency
        if est is None or not candidates:
            return [1.0] * len(candidates)
        costs = predicted_ttfts(ctx, candidates, self.work_weight)
        best = min(costs)
        scores = [best / t if t > 0.0 else 1.0 for t in costs]
        bound = self.tpot_slo_s
        if bound > 0:
            now, stale = ctx.now, ctx.stale_after_s
            over = [est.tpot_s(r, now, stale) > bound for r in candidates]
            if not all(over):
                scores = [0.0 if o else s for s, o in zip(scores, over, strict=True)]
        return scores


def predicted_ttfts(
    ctx: SchedulingContext, candidates: Sequence[ReplicaState], work_weight: float = 0.0
) -> list[float]:
    """Each candidate's predicted TTFT for `ctx.request` in seconds (`ctx.latency` must be set), plus
    `work_weight` x the seconds of its own uncached prefill there."""
    est = ctx.latency
    assert est is not None
    return est.costs(
        candidates, ctx.request.prompt_tokens, ctx.prefix_match, ctx.now, ctx.stale_after_s, work_weight
    )
