"""`prefix-spread`: a prefix group with more requests in flight on a replica than the least-loaded
candidate has in all (+ slack) is not sent more there."""

from dataclasses import replace

import pytest

from policies.latency.estimator import LatencyEstimator, Prediction
from policies.scheduling.builtin_profiles import builtin_profile_spec
from policies.scheduling.context import SchedulingContext
from policies.scheduling.filters.prefix_spread import PrefixSpreadFilter
from policies.types import ReplicaState, RequestInfo
from tests.policies.scheduling.builders import NOW, names, replica

BLOCK = 16
SHARED = 256  # a 4,096-token system prompt's keys
HOT = tuple(range(SHARED))


def prompt_keys(shared: int, own: int, salt: int) -> tuple[int, ...]:
    """A prompt's keys: the first `shared` of the hot prefix, then `own` keys of its own."""
    return HOT[:shared] + tuple(1_000_000 * (salt + 1) + i for i in range(own))


def ctx(est: LatencyEstimator | None, keys: tuple[int, ...]) -> SchedulingContext:
    info = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=len(keys) * BLOCK,
                       max_tokens=64, prefix_keys=keys)  # fmt: skip
    return SchedulingContext(request=info, now=NOW, prefix_match={}, prefix_blocks=len(keys), latency=est)


def ticket(est: LatencyEstimator, state: ReplicaState, keys: tuple[int, ...]) -> Prediction:
    """kvgate sends `state`'s replica a prompt with `keys`: its ticket, dispatched."""
    tokens = len(keys) * BLOCK
    p = est.predict(state, tokens, NOW, 1.0, prompt_tokens=tokens, output_tokens=64, prefix_keys=keys)
    return est.dispatched(p)


def send(est: LatencyEstimator, state: ReplicaState, keys: tuple[int, ...]) -> ReplicaState:
    """kvgate sent `state`'s replica a prompt with `keys`; the replica as the fleet state then has it."""
    ticket(est, state, keys)
    return replace(state, in_flight=state.in_flight + 1)


def hot(salt: int) -> tuple[int, ...]:
    return prompt_keys(SHARED, 16, salt)  # 256 of 272 keys shared: 94%


def test_a_hot_group_crowding_its_replica_takes_another() -> None:
    est = LatencyEstimator(BLOCK)
    a, b, c = replica("a"), replica("b"), replica("c")
    for i in range(5):
        a = send(est, a, hot(i))
    spread = PrefixSpreadFilter(slack=4.0)
    # 5 of the group on a, the least-loaded candidate has 0: 5 > 0 + 4, a is dropped.
    assert names(spread.filter(ctx(est, hot(99)), [a, b, c])) == ["b", "c"]
    # One request elsewhere raises the least load: 5 <= 1 + 4 on every candidate, all kept.
    b = send(est, b, prompt_keys(0, 272, 7))
    c = send(est, c, prompt_keys(0, 272, 8))
    candidates = [a, b, c]
    assert spread.filter(ctx(est, hot(99)), candidates) is candidates
    # A wider slack keeps a from the start.
    assert names(PrefixSpreadFilter(slack=5.0).filter(ctx(est, hot(99)), [a, replica("d")])) == ["a", "d"]


def test_other_traffic_on_a_replica_is_load_not_the_group() -> None:
    # A replica busy with other prompts (a different first block) stays: the load guard's business.
    est = LatencyEstimator(BLOCK)
    a, b = replica("a"), replica("b")
    for i in range(8):
        a = send(est, a, prompt_keys(0, 272, i))
    candidates = [a, b]
    assert PrefixSpreadFilter().filter(ctx(est, hot(99)), candidates) is candidates


def test_a_conversation_sharing_only_a_system_prompt_is_not_spread() -> None:
    # Turns of other conversations share the request's 64-key system prompt, 30% of its 208 keys:
    # under min_share they are not its group, and the conversation stays with its history.
    est = LatencyEstimator(BLOCK)
    a, b = replica("a"), replica("b")
    for i in range(8):
        a = send(est, a, prompt_keys(64, 144, i))
    turn = prompt_keys(64, 144, 99)
    candidates = [a, b]
    assert PrefixSpreadFilter().filter(ctx(est, turn), candidates) is candidates
    assert names(PrefixSpreadFilter(min_share=0.3).filter(ctx(est, turn), candidates)) == ["b"]


def test_requests_that_ended_no_longer_count() -> None:
    est = LatencyEstimator(BLOCK)
    a, b = replica("a"), replica("b")
    tickets = [ticket(est, a, hot(i)) for i in range(5)]
    a = replace(a, in_flight=5)
    assert names(PrefixSpreadFilter().filter(ctx(est, hot(99)), [a, b])) == ["b"]
    est.prefilled(tickets[0])
    est.ended(tickets[0])
    candidates = [a, b]
    assert PrefixSpreadFilter().filter(ctx(est, hot(99)), candidates) is candidates  # 4 <= 0 + 4


def test_without_the_latency_model_or_prefix_keys_it_keeps_everyone() -> None:
    est = LatencyEstimator(BLOCK)
    a, b = replica("a"), replica("b")
    for i in range(8):
        a = send(est, a, hot(i))
    candidates = [a, b]
    assert PrefixSpreadFilter().filter(ctx(None, hot(99)), candidates) is candidates
    assert PrefixSpreadFilter().filter(ctx(est, ()), candidates) is candidates
    assert PrefixSpreadFilter().filter(ctx(est, hot(99)), [a]) == [a]


@pytest.mark.parametrize(("slack", "share"), [(-1.0, 0.9), (4.0, 0.0), (4.0, 1.5)])
def test_refuses_bad_params(slack: float, share: float) -> None:
    with pytest.raises(ValueError, match=r"slack|min_share"):
        PrefixSpreadFilter(slack=slack, min_share=share)


def test_is_soft_and_in_the_predicted_latency_profile_only() -> None:
    assert PrefixSpreadFilter.soft is True
    types = [f["type"] for f in builtin_profile_spec("predicted-latency")["filters"]]
    assert "prefix-spread" in types
    assert "prefix-spread" not in [f["type"] for f in builtin_profile_spec("default")["filters"]]


def test_the_share_is_of_the_prompts_keys_whatever_counted_its_tokens() -> None:
    # A tokenizer may count more tokens than the prompt's keys cover (its keys are over the prompt's
    # bytes): the share is of the keys, so the group is still found.
    est = LatencyEstimator(BLOCK)
    a, b = replica("a"), replica("b")
    for i in range(5):
        a = send(est, a, hot(i))
    keys = hot(99)
    info = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=2 * len(keys) * BLOCK,
                       max_tokens=64, prefix_keys=keys)  # fmt: skip
    wide = SchedulingContext(request=info, now=NOW, prefix_match={}, prefix_blocks=len(keys), latency=est)
    assert names(PrefixSpreadFilter().filter(wide, [a, b])) == ["b"]
