"""The `latency-knee` filter's fast path keeps exactly the replicas of a straightforward reference, and
sharing the decision's quotes with the `predicted-latency` scorer changes no decision.

The filter prices every candidate on every request (with predicted admission on, the default), in the
one pass whose quotes the scorer then reads (`SchedulingContext.quotes`). The reference prices each
candidate on its own: its predicted TTFT through the model's plain input methods (`reference_cost_s`)
against the knee x `LatencyEstimator.unloaded_ttft_s` of the whole prompt (and each quote is held
to these, to the last bit), failing that against the gate's knee, at least the unloaded TTFT + a
decode step of the batch running there (`reference_step_s`). On random fleets, ledgers,
step dates, calibrations and prefix matches the two must keep the same replicas; and every built-in
profile must make the same decision (ranking, totals, drops) with the memo as without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from random import Random

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.kv_fit import GroupFit
from policies.latency.estimator import LatencyEstimator
from policies.latency.replica_model import Quote
from policies.latency_admission import knee_bound_s
from policies.scheduling.builtin_profiles import BUILTIN_PROFILE_NAMES, build_builtin_profile
from policies.scheduling.context import SchedulingContext
from policies.scheduling.filters.latency_knee import LatencyKneeFilter
from policies.types import ReplicaState, RequestInfo
from tests.policies.scheduling.builders import NOW, names
from tests.policies.scheduling.latency_fleets import (
    BLOCK,
    STALE,
    Spec,
    fleet,
    reference_cost_s,
    reference_running,
    reference_step_s,
    specs,
)


def reference_kept(ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> list[ReplicaState]:
    """The filter's definition, one candidate at a time (module docstring of `latency_knee`)."""
    est, knee = ctx.latency, ctx.knee_factor
    assert est is not None and knee is not None
    prompt = ctx.request.prompt_tokens
    within, stepped = [], []
    predicted_of = {}
    for r in candidates:
        uncached = est.uncached_tokens(prompt, ctx.prefix_match.get(r.name, 0))
        fresh = r.is_fresh(ctx.now, ctx.stale_after_s)
        predicted = predicted_of[r.name] = reference_cost_s(
            est.model(r.name, r.pool), r, fresh, uncached, ctx.now, 0.0
        )
        saving = est.prefill_s(r, prompt - uncached)  # the prefill its held prefix saves
        unloaded = est.unloaded_ttft_s(r, prompt)
        if predicted <= knee * unloaded + saving:
            within.append(r)
        # The gate's knee: at least a decode step of the batch running there beyond unloaded.
        bound = knee_bound_s(unloaded, knee, reference_step_s(est.model(r.name, r.pool), r, fresh))
        if predicted <= bound + saving:
            stepped.append(r)
    kept = stepped if ctx.kv_fit is not None else within or stepped
    if kept:
        return kept
    best = min(predicted_of.values())  # none within the knee: within the knee of the best one
    return [r for r in candidates if predicted_of[r.name] <= knee * best]


def context(prompt_tokens: int, match: dict[str, float], est: LatencyEstimator, knee: float | None,
            quotes: dict[str, Quote] | None, view: GroupFit | None = None) -> SchedulingContext:  # fmt: skip
    info = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=prompt_tokens, max_tokens=64,
                       prefix_keys=tuple(range(prompt_tokens // BLOCK)))  # fmt: skip
    return SchedulingContext(request=info, now=NOW, prefix_match=match, prefix_blocks=len(info.prefix_keys),
                             stale_after_s=STALE, latency=est, knee_factor=knee, quotes=quotes,
                             kv_fit=view)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(fleet_specs=st.lists(specs, min_size=1, max_size=8), prompt_tokens=st.integers(0, 40_000))
def test_each_quote_is_its_reference(fleet_specs: list[Spec], prompt_tokens: int) -> None:
    # To the last bit: the predicted TTFT, the uncached tokens, the fit's slope, the running requests
    # (kvgate's, or a fresh scrape's if more), the whole prompt's unloaded TTFT and the decode step of
    # the batch running there (0.0 when none runs).
    est, candidates, match = fleet(fleet_specs)
    memo: dict[str, Quote] = {}
    quotes = est.price(candidates, prompt_tokens, match, NOW, STALE, memo)
    assert [memo[r.name] for r in candidates] == quotes  # the decision's memo has them by name
    for r, quote in zip(candidates, quotes, strict=True):
        uncached = est.uncached_tokens(prompt_tokens, match.get(r.name, 0))
        model = est.model(r.name, r.pool)
        fresh = r.is_fresh(NOW, STALE)
        running = reference_running(r, fresh)
        ttft = reference_cost_s(model, r, fresh, uncached, NOW, 0.0)
        unloaded = est.unloaded_ttft_s(r, prompt_tokens)
        step = reference_step_s(model, r, fresh)
        assert step == est.ttft_and_step_s(r, uncached, NOW, STALE)[1]  # the gate's, for the same knee
        assert quote == (ttft, uncached, model.ttft.b, running, unloaded, step)


@settings(max_examples=300, deadline=None)
@given(
    fleet_specs=st.lists(specs, min_size=2, max_size=8),
    prompt_tokens=st.integers(0, 40_000),
    knee=st.sampled_from([1.0, 1.25, 2.0, 4.0]),
    placed=st.booleans(),
)
def test_the_filter_is_its_reference(
    fleet_specs: list[Spec], prompt_tokens: int, knee: float, placed: bool
) -> None:
    est, candidates, match = fleet(fleet_specs)
    memo: dict[str, Quote] = {}
    view = GroupFit(group=1, blocks=4.0) if placed else None  # a kv-fit profile's group ledger view
    kept = LatencyKneeFilter().filter(context(prompt_tokens, match, est, knee, memo, view), candidates)
    reference = reference_kept(context(prompt_tokens, match, est, knee, None, view), candidates)
    assert names(kept) == names(reference)
    # It priced every candidate into the decision's memo, for the scorer.
    assert sorted(memo) == sorted(names(candidates))


@settings(max_examples=150, deadline=None)
@given(
    fleet_specs=st.lists(specs, min_size=1, max_size=8),
    prompt_tokens=st.integers(0, 40_000),
    knee=st.sampled_from([None, 1.25, 2.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_sharing_the_quotes_changes_no_decision(
    fleet_specs: list[Spec], prompt_tokens: int, knee: float | None, seed: int
) -> None:
    est, candidates, match = fleet(fleet_specs)
    for name in BUILTIN_PROFILE_NAMES:
        profile = build_builtin_profile(name)
        alone = profile.schedule(context(prompt_tokens, match, est, knee, None), candidates, Random(seed))
        shared = profile.schedule(context(prompt_tokens, match, est, knee, {}), candidates, Random(seed))
        assert names(shared.ranked) == names(alone.ranked), name
        assert shared.totals == alone.totals, name
        assert shared.dropped == alone.dropped, name
