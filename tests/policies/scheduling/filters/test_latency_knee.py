"""`latency-knee`: keep the replicas where the request's predicted TTFT is within the gate's knee."""

import random

from policies.kv_fit import GroupFit
from policies.latency.estimator import LatencyEstimator
from policies.scheduling.builtin_profiles import BUILTIN_PROFILE_NAMES, build_builtin_profile
from policies.scheduling.context import SchedulingContext, latency_quotes
from policies.scheduling.filters.latency_knee import LatencyKneeFilter
from policies.types import ReplicaState, RequestInfo
from tests.policies.scheduling.builders import NOW, names, replica

BLOCK = 16
PROMPT = 1024  # the noisy neighbour's prompt: ~26 ms unloaded on the napkin prior


def ctx(
    est: LatencyEstimator | None, knee: float | None, match: dict[str, float] | None = None
) -> SchedulingContext:
    blocks = PROMPT // BLOCK
    info = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=PROMPT, max_tokens=64,
                       prefix_keys=tuple(range(blocks)))  # fmt: skip
    return SchedulingContext(
        request=info, now=NOW, prefix_match=match or {}, prefix_blocks=blocks, latency=est, knee_factor=knee
    )


def prefilling(est: LatencyEstimator, state: ReplicaState, tokens: int = PROMPT) -> None:
    """kvgate sent `state`'s replica a prompt of `tokens` that has not had its first token yet."""
    est.dispatched(est.predict(state, tokens, NOW, 1.0))


def test_keeps_the_replicas_within_the_knee() -> None:
    est = LatencyEstimator(BLOCK)
    a, b, c = replica("a"), replica("b"), replica("c")
    prefilling(est, a)  # a flood's 1,024-token prefill is ahead of the request on a: ~2x unloaded
    kept = LatencyKneeFilter().filter(ctx(est, 1.25), [a, b, c])
    assert names(kept) == ["b", "c"]
    # A looser knee takes a back.
    assert names(LatencyKneeFilter().filter(ctx(est, 3.0), [a, b, c])) == ["a", "b", "c"]


def test_when_none_qualifies_it_keeps_those_within_the_knee_of_the_best() -> None:
    est = LatencyEstimator(BLOCK)
    a, b, c = replica("a"), replica("b"), replica("c")
    prefilling(est, a)  # one prefill ahead: ~2x unloaded
    prefilling(est, b, 2 * PROMPT)  # two: ~3x, past 1.25 x a's
    prefilling(est, c, PROMPT + 64)  # a little more than a: within 1.25 x a's
    # b has the fewest requests in flight, so the scorers alone would take it (as they did live).
    assert names(LatencyKneeFilter().filter(ctx(est, 1.25), [a, b, c])) == ["a", "c"]
    # All alike: all kept, the scorers decide.
    d, e = replica("d"), replica("e")
    prefilling(est, d)
    prefilling(est, e)
    candidates = [d, e]
    assert LatencyKneeFilter().filter(ctx(est, 1.25), candidates) is candidates


def test_a_light_request_admitted_past_the_knee_goes_where_the_least_prefill_is_queued() -> None:
    # Live: a flood's prefill under way on r1, two of the light tenant's own queued on r0 (fewer in
    # flight there). Every built-in profile sends the light tenant's next request to r1.
    for name in BUILTIN_PROFILE_NAMES:
        est = LatencyEstimator(BLOCK)
        r0, r1 = replica("r0", in_flight=2, running=0), replica("r1", in_flight=16, running=15)
        prefilling(est, r0)
        prefilling(est, r0)
        prefilling(est, r1)
        profile = build_builtin_profile(name)
        for seed in range(3):
            d = profile.schedule(ctx(est, 1.25), [r0, r1], random.Random(seed))
            assert names(d.ranked)[0] == "r1", (name, seed)


def test_is_a_no_op_with_the_gate_off_or_without_latency_models() -> None:
    est = LatencyEstimator(BLOCK)
    a, b = replica("a"), replica("b")
    prefilling(est, a)
    candidates = [a, b]
    assert LatencyKneeFilter().filter(ctx(est, None), candidates) is candidates  # predicted admission off
    assert LatencyKneeFilter().filter(ctx(None, 1.25), candidates) is candidates


def test_a_held_prefix_counts_for_its_replica_not_against_it() -> None:
    # a holds 90% of the prompt and has a short prompt ahead of the request; b holds nothing and is
    # idle. On the uncached part alone a would be far past 1.25 x its (tiny) unloaded TTFT; against
    # the whole prompt's unloaded TTFT, as the gate prices it, its predicted TTFT is well within.
    est = LatencyEstimator(BLOCK)
    a, b = replica("a"), replica("b")
    prefilling(est, a, 200)
    match = {"a": 0.9 * PROMPT / BLOCK}
    assert names(LatencyKneeFilter().filter(ctx(est, 1.25, match), [a, b])) == ["a", "b"]


def test_a_held_prefix_also_counts_the_prefill_moving_away_would_repeat() -> None:
    # a holds 75% of the prompt but has 1,400 tokens of prefill queued: its predicted TTFT is past
    # 1.25 x the whole prompt's unloaded TTFT, yet within it plus the 768 tokens it saves. Sending
    # the request to an idle replica would re-prefill those there (and the next request of its
    # prefix would follow it): a stays. b, with the same queue and nothing held, is past the knee.
    est = LatencyEstimator(BLOCK)
    a, b, c = replica("a"), replica("b"), replica("c")
    prefilling(est, a, 1400)
    prefilling(est, b, 1400)
    match = {"a": 0.75 * PROMPT / BLOCK}
    context = ctx(est, 1.25, match)
    quotes = dict(zip("abc", latency_quotes(context, [a, b, c]), strict=True))
    unloaded = quotes["a"][4]
    saving = est.prefill_s(a, PROMPT - quotes["a"][1])
    assert 1.25 * unloaded < quotes["a"][0] <= 1.25 * unloaded + saving  # the case this test is about
    assert names(LatencyKneeFilter().filter(context, [a, b, c])) == ["a", "c"]
    # Holding nothing saves nothing: the same queue without the prefix is past the knee.
    assert names(LatencyKneeFilter().filter(ctx(est, 1.25), [a, b, c])) == ["c"]


def test_every_built_in_profile_routes_away_from_the_replica_past_the_knee() -> None:
    for name in BUILTIN_PROFILE_NAMES:
        est = LatencyEstimator(BLOCK)
        a, b = replica("a"), replica("b", in_flight=3, running=3)  # the default would prefer a
        prefilling(est, a)
        profile = build_builtin_profile(name)
        for seed in range(3):
            d = profile.schedule(ctx(est, 1.25), [a, b], random.Random(seed))
            assert names(d.ranked)[0] == "b", (name, seed)


def test_a_short_prompt_may_wait_for_the_decode_step_under_way_if_no_replica_is_nearer() -> None:
    # A 256-token prompt's unloaded TTFT is about one step, so 1.25 x it leaves less slack than the
    # decode step under way on a busy replica. a is decoding, its step just begun; b is idle; c is
    # computing a 4,000-token prefill, a step no decode cadence excuses.
    short = 256
    est = LatencyEstimator(BLOCK)
    a = replica("a", in_flight=4, in_flight_tokens=8_000, running=4)
    b = replica("b")
    c = replica("c", in_flight=1, in_flight_tokens=4_000, running=1)
    est.dispatched(est.predict(c, 4_000, NOW - 0.002, 1.0))
    est.step_seen("c", NOW - 0.001)  # c's step began after that dispatch: it is computing it
    est.step_seen("a", NOW - 0.0005)
    info = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=short, max_tokens=64,
                       prefix_keys=tuple(range(short // BLOCK)))  # fmt: skip

    def context(view: GroupFit | None = None) -> SchedulingContext:
        return SchedulingContext(request=info, now=NOW, prefix_match={}, prefix_blocks=short // BLOCK,
                                 latency=est, knee_factor=1.25, quotes={}, kv_fit=view)  # fmt: skip

    quotes = dict(zip("abc", latency_quotes(context(), [a, b, c]), strict=True))
    predicted, _, _, _, unloaded, step = quotes["a"]
    assert step == est.ttft_and_step_s(a, short, NOW, 1.0)[1] > 0 and quotes["b"][5] == 0.0  # idle: no step
    assert 1.25 * unloaded < predicted <= unloaded + step  # the case: past 1.25x, within the step
    # An idle replica is nearer: it goes first. Without one, a mid-step replica rather than c.
    assert names(LatencyKneeFilter().filter(context(), [a, b, c])) == ["b"]
    assert names(LatencyKneeFilter().filter(context(), [a, c])) == ["a"]
    # With a group ledger's view (the kv-fit scorer's), every replica the gate would send it to
    # stays: where the group lives is that scorer's decision, not the step's phase.
    view = GroupFit(group=1, blocks=4.0)
    assert names(LatencyKneeFilter().filter(context(view), [a, b, c])) == ["a", "b"]
