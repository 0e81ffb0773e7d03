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
                + the prefill seconds there of the prefix the replica holds (what it saves)

Failing that, it keeps the replicas within the gate's whole knee, which is at least the unloaded
TTFT + a decode step of the batch running there (`knee_bound_s`: a request sent to a busy replica
waits for the step under way, which holding it would not shorten). So among replicas the gate
would send a short prompt to, those whose step under way ends soonest go first: keeping all of
them (one tier) let `default`'s scorers, which count requests rather than seconds, send 256-token
prompts to replicas mid-step, TTFT p50 9.2 -> 14.4 ms at 2 streams per replica (DES; docs/
benchmarks.md, "A decode step in the knee"). With the `kv-fit` scorer in the profile (a group
ledger view in the context) it keeps them all: which of them a prefix group lives on is that
scorer's decision, and the first tier alone put 9 groups on a replica that fits 8.

The bound prices the whole prompt, as the gate does: a replica holding the prefix has a smaller
predicted TTFT against the same bound, so a cache hit counts for the replica that holds it, never
against it (a bound on the uncached part alone would call a held prefix "over the knee" as soon as
anything was queued there, and move the conversation). The held prefix counts a second time in the
bound: sent elsewhere, the request would prefill those tokens again (and its prefix's next requests
would follow it there), which is the cost `predicted-latency` weighs against the queue (its
`work_weight`). Without it the filter moved requests off their prefix's replica as soon as about a
quarter of a prompt's prefill was queued beyond the knee, where the scorer would have kept them:
on shared prefixes past the knee both profiles lost goodput and hit rate to it, in the DES with
flow control modelled (docs/benchmarks.md, "Flow control in the DES, and the `latency-knee` filter
with held prefixes"). With no prefix held (random prompts, a flood's) the bound is the gate's.

When no candidate is within the gate's knee either (a light tenant's request admitted at
`light_knee_factor`, a tenant alone at `solo_knee_factor`, a critical request, a hard cap's room),
it keeps those within the knee of the best one instead: predicted <= `knee_factor` x the least
predicted TTFT among the candidates. Before, it kept every candidate, and the scorers, which count
requests rather than the prefill work queued, sent a light tenant's request to the replica with the
fewest in flight: in a live noisy-neighbour run, three of its requests in a row to a replica already
holding two of its prefills (~68 ms predicted) instead of the one finishing a flood's prefill (~40
ms), each then waiting ~85 ms for a step that prefilled all three (docs/benchmarks.md, "The knee
filter when no replica is within the knee"). It never keeps nothing.

Both are priced in the decision's one pass over the candidates (`latency_quotes`), which the
`predicted-latency` scorer then reads instead of pricing them again.

A no-op when the context carries no knee (`SchedulingContext.knee_factor` is None: predicted
admission is off) or no latency models, and with fewer than two candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.latency.replica_model import TTFT_X_TOKENS
from policies.scheduling.context import SchedulingContext, latency_quotes
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class LatencyKneeFilter:
    """Keeps candidates whose predicted TTFT <= `ctx.knee_factor` x their unloaded TTFT; when none
    qualifies, those within the gate's knee (at least a decode step beyond unloaded), and when none
    does, those within `ctx.knee_factor` x the least predicted TTFT (module docstring)."""

    name: str = "latency-knee"
    soft: ClassVar[bool] = True

    def filter(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[ReplicaState]:
        knee, est = ctx.knee_factor, ctx.latency
        if knee is None or est is None or len(candidates) < 2:
            return candidates
        quotes = latency_quotes(ctx, candidates)  # the decision's quotes: the scorer reads them too
        whole = ctx.request.prompt_tokens
        within: list[ReplicaState] = []  # within knee_factor x unloaded (+ the held prefix's saving)
        stepped: list[ReplicaState] = []  # within the gate's knee: that, or a decode step beyond unloaded
        for r, (predicted, own, slope, _, unloaded, step) in zip(candidates, quotes, strict=True):
            saving = slope * (whole - own) / TTFT_X_TOKENS if own < whole else 0.0
            bound = knee * unloaded
            floor = unloaded + step  # `knee_bound_s`, inlined: the request path, per candidate
            if predicted <= (bound if bound > floor else floor) + saving:
                stepped.append(r)
                if predicted <= bound + saving:
                    within.append(r)
        # Where the profile places prefix groups (`kv-fit`), placement decides among every replica
        # the gate would send the request to; elsewhere those whose step under way ends soonest.
        kept = stepped if ctx.kv_fit is not None else within or stepped
        if not kept:
            bound = knee * min(q[0] for q in quotes)
            kept = [r for r, q in zip(candidates, quotes, strict=True) if q[0] <= bound]
        if len(kept) == len(candidates):
            return candidates
        return kept
