"""The `predicted-latency` scorer's fast path gives exactly the scores of a straightforward reference.

The scorer runs on every request for every candidate, so its loop is tuned (`LatencyEstimator.costs`:
one pass, no int() call for an integer prefix count; float comparisons). The reference below takes
each candidate on its own through the estimator's plain methods; on random fleets, ledgers, step
dates, calibrations, prefix matches (whole and fractional blocks) and SLO bounds the two must agree
to the last bit, so the tuning can never change a decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.latency.estimator import LatencyEstimator
from policies.latency.prior import LatencyPrior
from policies.scheduling.context import SchedulingContext
from policies.scheduling.scorers.predicted_latency import PredictedLatencyScorer
from policies.types import ReplicaState, RequestInfo
from tests.policies.scheduling.builders import NOW, replica

BLOCK = 16
STALE = 1.0


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
        costs.append(model.cost_s(r, fresh, uncached, ctx.now, scorer.work_weight))
    if scorer.batch_weight:
        # What its prefill holds up: the requests decoding there (kvgate's, or a fresh scrape's if
        # more) x its own uncached prefill's seconds; only the differences between candidates.
        stalls = []
        for r in candidates:
            running = max(r.in_flight, r.running) if r.is_fresh(ctx.now, ctx.stale_after_s) else r.in_flight
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


class Spec(NamedTuple):
    """One replica as the scorer may find it."""

    in_flight: int
    in_flight_tokens: int
    running: int
    waiting: int
    scraped_ago: float | None  # None: never scraped
    slow: bool  # in the other pool: a prior twice as slow
    dispatched: list[int]  # the ledger: uncached tokens of each request sent
    prefilled: int  # how many of those got their first token
    step_ago: float | None  # the last chunk relayed
    observed: list[float]  # TTFTs observed, as a multiple of the prediction (calibration)
    held: int | float | None  # matched index blocks (a fraction: the exact index's conversion)


specs = st.builds(
    Spec,
    in_flight=st.integers(0, 40),
    in_flight_tokens=st.integers(0, 400_000),
    running=st.integers(0, 64),
    waiting=st.integers(0, 8),
    scraped_ago=st.one_of(st.none(), st.floats(0.0, 3.0)),
    slow=st.booleans(),
    dispatched=st.lists(st.integers(0, 8000), max_size=4),
    prefilled=st.integers(0, 4),
    step_ago=st.one_of(st.none(), st.floats(0.0, 0.05)),
    observed=st.lists(st.floats(0.5, 2.0), max_size=3),
    held=st.one_of(st.none(), st.integers(0, 600), st.floats(0.0, 600.0)),
)


@settings(max_examples=300, deadline=None)
@given(
    fleet=st.lists(specs, min_size=1, max_size=8),
    prompt_tokens=st.integers(0, 40_000),
    work_weight=st.sampled_from([0.0, 0.5, 1.0]),
    batch_weight=st.sampled_from([0.0, 0.5, 2.0]),
    tpot_slo_s=st.sampled_from([0.0, 0.008, 0.02]),
)
def test_the_scorer_is_its_reference(
    fleet: list[Spec], prompt_tokens: int, work_weight: float, batch_weight: float, tpot_slo_s: float
) -> None:
    est = LatencyEstimator(BLOCK, priors={"slow": LatencyPrior().scaled(2.0)})
    candidates: list[ReplicaState] = []
    match: dict[str, float] = {}
    for i, spec in enumerate(fleet):
        r = replica(
            f"r{i}",
            pool="slow" if spec.slow else "m",
            in_flight=spec.in_flight,
            in_flight_tokens=spec.in_flight_tokens,
            running=spec.running,
            waiting=spec.waiting,
            scraped_at=None if spec.scraped_ago is None else NOW - spec.scraped_ago,
        )
        tickets = [est.predict(r, u, NOW, STALE) for u in spec.dispatched]
        for t in tickets:
            est.dispatched(t)
        for t, ratio in zip(tickets, spec.observed, strict=False):
            est.observe_ttft(t, t.ttft_s * ratio)
        for t in tickets[: spec.prefilled]:
            est.prefilled(t)
        if spec.step_ago is not None:
            est.step_seen(r.name, NOW - spec.step_ago)
        if spec.held is not None:
            match[r.name] = spec.held
        candidates.append(r)
    info = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=prompt_tokens, max_tokens=64,
                       prefix_keys=tuple(range(prompt_tokens // BLOCK)))  # fmt: skip
    ctx = SchedulingContext(request=info, now=NOW, prefix_match=match, prefix_blocks=len(info.prefix_keys),
                            stale_after_s=STALE, latency=est)  # fmt: skip
    scorer = PredictedLatencyScorer(tpot_slo_s=tpot_slo_s, work_weight=work_weight, batch_weight=batch_weight)
    assert list(scorer.score(ctx, candidates)) == reference_scores(scorer, ctx, candidates)
