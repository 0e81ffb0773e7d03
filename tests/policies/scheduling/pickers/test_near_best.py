import random
from collections import Counter

import pytest

from policies.scheduling.context import SchedulingContext
from policies.scheduling.pickers.max_score import MaxScorePicker
from policies.scheduling.pickers.near_best import NearBestPicker
from policies.scheduling.registry import build_profile
from policies.types import RequestInfo
from tests.policies.scheduling.builders import context, names, replica

CANDIDATES = [replica(n) for n in ("a", "b", "c", "d", "e", "f", "g", "h")]


def with_keys(keys: tuple[int, ...], match: dict[str, int] | None = None) -> SchedulingContext:
    info = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=100, max_tokens=10,
                       prefix_keys=keys)
    return SchedulingContext(request=info, now=0.0, prefix_match=match or {}, prefix_blocks=len(keys))


def test_spreads_among_near_equal_candidates_and_is_reproducible_with_a_seeded_rng() -> None:
    # a..d within 0.5 of the best, e..h clearly behind: without prefix keys the rng draws the winner.
    totals = [2.0, 1.9, 1.7, 1.6, 0.5, 0.4, 0.2, 0.0]
    picker = NearBestPicker(margin=0.5)
    wins = Counter(picker.pick(context(), CANDIDATES, totals, random.Random(s))[0].name for s in range(200))
    assert set(wins) == {"a", "b", "c", "d"}
    assert min(wins.values()) > 200 / 4 / 2  # roughly even: no candidate starved
    for seed in range(5):
        first = names(picker.pick(context(), CANDIDATES, totals, random.Random(seed)))
        assert first == names(picker.pick(context(), CANDIDATES, totals, random.Random(seed)))
        assert first[4:] == ["e", "f", "g", "h"]  # everyone else keeps the order of their totals


def test_a_clearly_better_candidate_always_wins() -> None:
    totals = [1.0, 1.2, 4.0, 1.1, 0.0, 0.3, 1.4, 0.9]  # c holds the prefix: 3.0 ahead of the rest
    picker = NearBestPicker(margin=0.5)
    for seed in range(50):
        assert picker.pick(context(), CANDIDATES, totals, random.Random(seed))[0].name == "c"
        keyed = picker.pick(with_keys((seed, seed + 1)), CANDIDATES, totals, random.Random(seed))
        assert keyed[0].name == "c"


def test_a_prefix_goes_to_the_same_replica_whatever_the_rng_and_candidate_order() -> None:
    # What lets independent gateway processes agree on where a shared prefix lives.
    totals = [1.0] * len(CANDIDATES)
    picker = NearBestPicker(margin=0.5, hash_blocks=4)
    ctx = with_keys((11, 22, 33, 44, 55, 66))
    winners = set()
    for seed in range(20):
        order = list(range(len(CANDIDATES)))
        random.Random(seed).shuffle(order)
        shuffled = [CANDIDATES[i] for i in order]
        winners.add(picker.pick(ctx, shuffled, totals, random.Random(seed))[0].name)
    assert len(winners) == 1
    # Only the first hash_blocks blocks count: a different question after the shared prefix agrees.
    other_tail = with_keys((11, 22, 33, 44, 77, 88))
    assert picker.pick(other_tail, CANDIDATES, totals, random.Random(99))[0].name in winners


def test_different_prefixes_spread_over_the_near_best() -> None:
    totals = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    picker = NearBestPicker(margin=0.5)
    rng = random.Random(0)
    wins = Counter(picker.pick(with_keys((k,)), CANDIDATES, totals, rng)[0].name for k in range(400))
    assert set(wins) == {"a", "b", "c", "d"} and min(wins.values()) > 50


def test_margin_zero_is_max_score() -> None:
    totals = [1.0, 3.0, 3.0, 0.5, 3.0, 2.9, 0.0, 1.0]
    for seed in range(20):
        picker = NearBestPicker(margin=0.0, hash_blocks=0)
        near = picker.pick(context(), CANDIDATES, totals, random.Random(seed))
        best = MaxScorePicker().pick(context(), CANDIDATES, totals, random.Random(seed))
        assert names(near) == names(best)


def test_single_empty_and_bad_params() -> None:
    picker = NearBestPicker()
    assert names(picker.pick(context(), CANDIDATES[:1], [0.0], random.Random(0))) == ["a"]
    assert picker.pick(context(), [], [], random.Random(0)) == []
    with pytest.raises(ValueError, match="margin"):
        build_profile({"picker": {"type": "near-best", "params": {"margin": -0.1}}})
    with pytest.raises(ValueError, match="hash_blocks"):
        build_profile({"picker": {"type": "near-best", "params": {"hash_blocks": -1}}})
    built = build_profile({"picker": {"type": "near-best", "params": {"margin": 1, "hash_blocks": 0}}})
    assert built.picker == NearBestPicker(margin=1.0, hash_blocks=0)


def test_among_replicas_that_hold_the_prefix_the_rng_spreads_its_requests() -> None:
    # Once this gateway believes near-best replicas hold the prompt, hashing would send every near-tie
    # of the group to one of them; the rng spreads them as max-score's tie-break did.
    totals = [4.0, 4.0, 4.0, 0.5, 0.0, 0.0, 0.0, 0.0]
    held = with_keys((5, 6, 7), match={"a": 3, "b": 3, "c": 3})
    picker = NearBestPicker(margin=0.25)
    wins = Counter(picker.pick(held, CANDIDATES, totals, random.Random(s))[0].name for s in range(60))
    assert set(wins) == {"a", "b", "c"}
    cold = with_keys((5, 6, 7))
    assert len({picker.pick(cold, CANDIDATES, totals, random.Random(s))[0].name for s in range(60)}) == 1
