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
the TTFT alone.

`batch_weight` adds what the choice costs the requests decoding there now: a step that carries a
prefill lasts as long as the prefill's compute, so each of the replica's running requests waits
about the prefill's seconds for its next token. The term is `batch_weight` x running requests x the
seconds of its own uncached prefill there. Without it the TTFT alone sends new work to whichever
replica has no prefill queued however many requests it is decoding, the batches drift apart and each
prefill stalls a crowded batch (docs/benchmarks.md, "Predicted latency (issue #11)": in-flight skew
p99 5-7 requests against 2-4.5 for `default`, 1-5% less goodput); with it a new conversation goes
where fewer requests are decoding, and a held prefix, which leaves less to prefill, weighs more on a
busy replica. The running count is the larger of kvgate's own in flight and a fresh scrape's running.

Score = best cost / the candidate's (1 for the best, 0.5 for one twice as costly):
a ratio, so the picker's margin is a share of the cost, and replicas of different speeds compare in
seconds.
`kv_weight` adds the candidate's predicted wait for free KV blocks (`policies.latency.kv_admission`:
the queue there played forward until the prompt's blocks fit) times the weight. Without it a replica
filling with requests that wait for blocks still looks cheap by its prefill ahead, and keeps taking
more (docs/benchmarks.md, "The KV wait in `predicted-latency`'s score"). The play costs tens of
microseconds per candidate on a busy replica, so it is made only for candidates that can still score
above `1 / KV_REACH`: in increasing order of cost, until the next one's cost without its wait is
`KV_REACH` times the best with it. The others keep their cost without the wait (their score is at
most `1 / KV_REACH` either way).

With `tpot_slo_s` > 0, a candidate whose predicted time per output token is over it scores 0 unless
every candidate is over it. Without latency models in the context every candidate scores 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from policies.latency.replica_model import quote_costs
from policies.scheduling.context import SchedulingContext, latency_quotes
from policies.types import ReplicaState

KV_REACH = 2.0  # candidates whose cost without a KV wait is this many times the best get none


@dataclass(frozen=True, slots=True)
class PredictedLatencyScorer:
    """Best predicted cost / the candidate's (module docstring); `tpot_slo_s` 0 means no TPOT bound;
    `work_weight` (>= 0) prices the candidate's own uncached prefill beside the TTFT, `batch_weight`
    (>= 0) the stall that prefill puts on the requests decoding there."""

    name: str = "predicted-latency"
    tpot_slo_s: float = 0.0
    work_weight: float = 0.0
    batch_weight: float = 0.0
    kv_weight: float = 0.0

    def __post_init__(self) -> None:
        for field in ("tpot_slo_s", "work_weight", "batch_weight", "kv_weight"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{field} must be finite and >= 0, got {value}")

    def score(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[float]:
        est = ctx.latency
        if est is None or not candidates:
            return [1.0] * len(candidates)
        quotes = latency_quotes(ctx, candidates)  # the decision's quotes: once for the knee filter too
        if self.batch_weight:
            stalls: list[float] = []
            costs = quote_costs(quotes, self.work_weight, stalls)
            # Only the differences: a stall every candidate would cause is no reason to prefer one,
            # and added whole it would shrink every ratio below, widening the picker's margin.
            least, w = min(stalls), self.batch_weight
            costs = [c + w * (s - least) for c, s in zip(costs, stalls, strict=True)]
        else:
            costs = quote_costs(quotes, self.work_weight)
        if self.kv_weight:
            costs = _with_kv_waits(ctx, candidates, costs, self.kv_weight)
        best = min(costs)
        scores = [best / t if t > 0.0 else 1.0 for t in costs]
        bound = self.tpot_slo_s
        if bound > 0:
            now, stale = ctx.now, ctx.stale_after_s
            over = [est.tpot_s(r, now, stale) > bound for r in candidates]
            if not all(over):
                scores = [0.0 if o else s for s, o in zip(scores, over, strict=True)]
        return scores


def _with_kv_waits(
    ctx: SchedulingContext, candidates: Sequence[ReplicaState], costs: list[float], weight: float
) -> list[float]:
    """`costs` plus `weight` x each candidate's predicted KV wait, for those that can still score
    above 1 / KV_REACH (module docstring)."""
    est = ctx.latency
    assert est is not None
    req = ctx.request
    if req.prompt_tokens <= 0:
        return costs
    out = list(costs)
    best = math.inf
    for i in sorted(range(len(costs)), key=costs.__getitem__):
        cost = costs[i]
        if cost >= KV_REACH * best:
            break  # this one and every later one: at most 1 / KV_REACH of the best, wait or not
        r = candidates[i]
        wait = est.kv_wait_s(r, req.prompt_tokens, req.prefix_keys, ctx.now, ctx.stale_after_s)
        if wait > 0.0:
            cost += weight * wait
            out[i] = cost
        if cost < best:
            best = cost
    return out


def predicted_ttfts(
    ctx: SchedulingContext, candidates: Sequence[ReplicaState], work_weight: float = 0.0
) -> list[float]:
    """Each candidate's predicted TTFT for `ctx.request` in seconds (`ctx.latency` must be set), plus
    `work_weight` x the seconds of its own uncached prefill there."""
    return quote_costs(latency_quotes(ctx, candidates), work_weight)


def batch_stalls(ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> list[float]:
    """Each candidate's running requests x the seconds of `ctx.request`'s own uncached prefill there
    (`ctx.latency` must be set): the time its prefill holds up the batch decoding there. The scorer
    takes them from the same quotes as the costs (`quote_costs`' `stalls`); this is that step."""
    stalls: list[float] = []
    quote_costs(latency_quotes(ctx, candidates), 0.0, stalls)
    return stalls
