"""`latency-knee`: prefer replicas where the request's predicted TTFT is within the admission knee. Soft.

The latency gate (`flow_control.predicted_admission`, policies/latency_admission) admits a request
while SOME replica of its pool is within `knee_factor` x the request's unloaded TTFT there; the
scorers then choose among all of them, and may send it to a replica whose engine is in the middle of
another long prefill (the one the gate had counted as full). This filter keeps only the replicas
within the knee, so the request goes where it was admitted: a light tenant's request arriving while
one replica prefills a flood's 1,024-token prompt goes to the other one (docs/benchmarks.md,
"Third round: routing away from the knee").

    predicted = the request's predicted TTFT there now, its prefix match counted (its uncached part)
    bound     = `knee_factor` x its unloaded TTFT there for the WHOLE prompt (the gate's bound)

The bound prices the whole prompt, as the gate does: a replica holding the prefix has a smaller
predicted TTFT against the same bound, so a cache hit counts for the replica that holds it, never
against it (a bound on the uncached part alone would call a held prefix "over the knee" as soon as
anything was queued there, and move the conversation).

Soft: when no candidate is within the knee every candidate is kept (the scorers decide as before).
Both are priced in the decision's one pass over the candidates (`latency_quotes`), which the
`predicted-latency` scorer then reads instead of pricing them again.

A no-op when the context carries no knee (`SchedulingContext.knee_factor` is None: predicted
admission is off) or no latency models, and with fewer than two candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.scheduling.context import SchedulingContext, latency_quotes
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class LatencyKneeFilter:
    """Keeps candidates whose predicted TTFT <= `ctx.knee_factor` x their unloaded TTFT (module
    docstring); all of them when none qualifies."""

    name: str = "latency-knee"
    soft: ClassVar[bool] = True

    def filter(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[ReplicaState]:
        knee, est = ctx.knee_factor, ctx.latency
        if knee is None or est is None or len(candidates) < 2:
            return candidates
        quotes = latency_quotes(ctx, candidates)  # the decision's quotes: the scorer reads them too
        kept = []
        for r, (predicted, _, _, _, unloaded) in zip(candidates, quotes, strict=True):
            if predicted <= knee * unloaded:
                kept.append(r)
        if not kept or len(kept) == len(candidates):
            return candidates
        return kept
