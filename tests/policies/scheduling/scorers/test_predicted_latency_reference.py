"""The `predicted-latency` scorer's fast path gives exactly the scores of a straightforward reference.

The scorer runs on every request for every candidate, so its loop is tuned (`LatencyEstimator.price`:
one pass, no int() call for an integer prefix count, quotes shared with the `latency-knee` filter;
float comparisons). The reference below takes each candidate on its own through the model's plain
input methods (`reference_cost_s`); on random fleets, ledgers, step dates, calibrations, prefix
matches (whole and fractional blocks) and SLO bounds the two must agree to the last bit, so the
tuning can never change a decision.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.latency.replica_model import Quote
from policies.scheduling.context import SchedulingContext
from policies.scheduling.scorers.predicted_latency import PredictedLatencyScorer
from policies.types import ReplicaState, RequestInfo
from tests.policies.scheduling.builders import NOW
from tests.policies.scheduling.latency_fleets import (
    BLOCK,
    STALE,
    Spec,
    fleet,
    reference_cost_s,
    reference_running,
    specs,
)


def reference_scores(
    scorer: PredictedLatencyScorer, ctx: SchedulingContext, candidates: Sequence[ReplicaState]
) -> list[float]:
    """The scorer's definition, one candidate at a time (module docstring of `predicted_latency`)."""
    est = ctx.latency
    assert est is not None
    costs = []
    for r in candidates:
        uncached = est.uncached_tokens(ctx.request.prompt_tokens, ctx.prefix_match.get(r.name, 0))
        model = est.model(r.name, r.pool)
        fresh = r.is_fresh(ctx.now, ctx.stale_after_s)
        costs.append(reference_cost_s(model, r, fresh, uncached, ctx.now, scorer.work_weight))
    if scorer.batch_weight:
        # What its prefill holds up: the requests decoding there (kvgate's, or a fresh scrape's if
        # more) x its own uncached prefill's seconds; only the differences between candidates.
        stalls = []
        for r in candidates:
            running = reference_running(r, r.is_fresh(ctx.now, ctx.stale_after_s))
            uncached = est.uncached_tokens(ctx.request.prompt_tokens, ctx.prefix_match.get(r.name, 0))
            stalls.append(running * est.prefill_s(r, uncached) if running else 0.0)
        least = min(stalls)
        costs = [c + scorer.batch_weight * (s - least) for c, s in zip(costs, stalls, strict=True)]
    best = min(costs)
    scores = [best / c if c > 0 else 1.0 for c in costs]
    if scorer.tpot_slo_s > 0:
        over = [est.tpot_s(r, ctx.now, ctx.stale_after_s) > scorer.tpot_slo_s for r in candidates]
        if not all(over):
            scores = [0.0 if o else s for s, o in zip(scores, over, strict=True)]
    return scores


@settings(max_examples=300, deadline=None)
@given(
    fleet_specs=st.lists(specs, min_size=1, max_size=8),
    shared=st.booleans(),
    prompt_tokens=st.integers(0, 40_000),
    work_weight=st.sampled_from([0.0, 0.5, 1.0]),
    batch_weight=st.sampled_from([0.0, 0.5, 2.0]),
    tpot_slo_s=st.sampled_from([0.0, 0.008, 0.02]),
)
def test_the_scorer_is_its_reference(
    fleet_specs: list[Spec], prompt_tokens: int, work_weight: float, batch_weight: float, tpot_slo_s: float,
    shared: bool,
) -> None:  # fmt: skip
    est, candidates, match = fleet(fleet_specs)
    info = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=prompt_tokens, max_tokens=64,
                       prefix_keys=tuple(range(prompt_tokens // BLOCK)))  # fmt: skip
    ctx = SchedulingContext(request=info, now=NOW, prefix_match=match, prefix_blocks=len(info.prefix_keys),
                            stale_after_s=STALE, latency=est)  # fmt: skip
    scorer = PredictedLatencyScorer(tpot_slo_s=tpot_slo_s, work_weight=work_weight, batch_weight=batch_weight)
    # With a decision's memo (`shared`), some of the candidates priced already, as by the knee filter
    # (which sees them all, the scorer those it kept): the scorer reads their quotes, prices the rest.
    memo: dict[str, Quote] | None = None
    if shared:
        memo = {}
        est.price(candidates[::2], prompt_tokens, match, NOW, STALE, memo)
    scores = list(scorer.score(ctx._replace(quotes=memo), candidates))
    assert scores == reference_scores(scorer, ctx, candidates)
    if memo is not None:
        assert sorted(memo) == sorted(r.name for r in candidates)  # the rest joined the decision's memo
