"""policies/traffic_split: quotas, the sticky bucket hash, and weight changes that move the fewest keys."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.traffic_split import (
    BUCKETS,
    Split,
    bucket_of,
    bucket_of_draw,
    moved,
    quotas,
    route_key,
)


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        ([90, 10], (9000, 1000)),
        ([1, 1, 1], (3334, 3333, 3333)),  # the remainder goes to the lowest index on a tie
        ([0, 5], (0, 10_000)),
        ([2, 0, 1], (6667, 0, 3333)),
        ([1], (10_000,)),
        ([1, 2, 3, 4, 5, 6, 7], (357, 714, 1071, 1429, 1786, 2143, 2500)),
    ],
)
def test_quotas_are_proportional_and_sum_to_the_buckets(
    weights: list[int], expected: tuple[int, ...]
) -> None:
    assert quotas(weights) == expected
    assert sum(expected) == BUCKETS


@pytest.mark.parametrize("weights", [[], [0, 0], [-1, 2], [1.5, 1], [True, 1], [1] * 256])
def test_bad_weights_are_refused(weights: list[int]) -> None:
    with pytest.raises(ValueError):
        quotas(weights)


def test_fresh_split_holds_contiguous_homes_in_order() -> None:
    s = Split.fresh(["a", "b", "c"], [50, 30, 20])
    assert s.homes == ((0, 5000), (5000, 8000), (8000, 10_000))
    assert s.counts() == (5000, 3000, 2000)
    assert s.target(0) == "a" and s.target(4999) == "a" and s.target(5000) == "b" and s.target(9999) == "c"


def test_the_bucket_hash_is_stable_and_seeded_by_the_route() -> None:
    # Fixed values: two gateway processes (or a restarted one) must agree, so no per-process seed.
    assert bucket_of(route_key("chat"), b"user-1") == bucket_of(route_key("chat"), b"user-1")
    assert bucket_of(route_key("chat"), b"user-1") == 5877
    assert bucket_of(route_key("chat2"), b"user-1") != bucket_of(route_key("chat"), b"user-1")
    assert bucket_of_draw(0.0) == 0 and bucket_of_draw(0.99999999999) == BUCKETS - 1


def test_ten_thousand_sticky_keys_split_90_10_within_a_point_and_a_half() -> None:
    s = Split.fresh(["base", "base:v2"], [90, 10])
    prefix = route_key("chat")
    arms = Counter(s.target(bucket_of(prefix, f"session-{i}".encode())) for i in range(10_000))
    assert abs(arms["base:v2"] / 10_000 - 0.10) <= 0.015, arms


def test_90_10_to_80_20_moves_only_the_keys_it_must_all_from_the_90_arm_and_back() -> None:
    before = Split.fresh(["base", "base:v2"], [90, 10])
    after = before.reweighted([80, 20])
    assert moved(before, after) == 1000  # exactly 10% of the buckets
    for b in range(BUCKETS):
        if before.layout[b] != after.layout[b]:
            assert before.target(b) == "base" and after.target(b) == "base:v2"
    # over keys: ~10% move, every one from the 90 arm to the 10 arm
    prefix = route_key("chat")
    keys = [f"user-{i}".encode() for i in range(10_000)]
    moves = [(before.target(bucket_of(prefix, k)), after.target(bucket_of(prefix, k))) for k in keys]
    changed = [m for m in moves if m[0] != m[1]]
    assert abs(len(changed) / len(keys) - 0.10) <= 0.015
    assert set(changed) == {("base", "base:v2")}
    # undone, every key is back where it was
    assert after.reweighted([90, 10]).layout == before.layout


def test_an_arm_whose_quota_is_unchanged_keeps_every_bucket() -> None:
    before = Split.fresh(["a", "b", "c"], [30, 40, 30])
    after = before.reweighted([40, 40, 20])  # c gives 10% to a; b is not touched
    assert moved(before, after) == 1000
    for b in range(BUCKETS):
        if before.target(b) == "b" or after.target(b) == "b":
            assert before.target(b) == after.target(b) == "b"


def test_with_layout_refuses_a_layout_that_does_not_realise_the_weights() -> None:
    s = Split.fresh(["a", "b"], [1, 1])
    other = s.reweighted([3, 1])
    assert s.with_layout([3, 1], other.layout) == other
    with pytest.raises(ValueError, match="does not realise"):
        s.with_layout([1, 1], other.layout)
    with pytest.raises(ValueError, match="bytes"):
        s.with_layout([1, 1], b"\x00" * 10)
    with pytest.raises(ValueError, match="bytes"):
        s.with_layout([1, 1], b"\x02" * BUCKETS)


weights_st = st.lists(st.integers(0, 100), min_size=1, max_size=6).filter(lambda w: sum(w) > 0)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_sequence_of_weight_changes_moves_the_minimum_each_time(data: st.DataObject) -> None:
    first = data.draw(weights_st)
    n = len(first)
    split = Split.fresh([f"t{i}" for i in range(n)], first)
    same_len = st.lists(st.integers(0, 100), min_size=n, max_size=n).filter(lambda w: sum(w) > 0)
    for weights in data.draw(st.lists(same_len, min_size=1, max_size=4)):
        have, want = split.counts(), quotas(weights)
        after = split.reweighted(weights)
        assert after.counts() == want
        assert moved(split, after) == sum(max(0, h - w) for h, w in zip(have, want, strict=True))
        for b in range(BUCKETS):
            x, y = split.layout[b], after.layout[b]
            if x != y:  # only from an arm that shrank to one that grew
                assert want[x] < have[x] and want[y] > have[y]
        split = after


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 1000), st.integers(0, 1000), st.integers(0, 1000), st.integers(0, 1000))
def test_two_arms_layout_is_a_function_of_the_weights(a: int, b: int, c: int, d: int) -> None:
    if a + b == 0 or c + d == 0:
        return
    via = Split.fresh(["x", "y"], [a, b]).reweighted([c, d])
    assert via.layout == Split.fresh(["x", "y"], [c, d]).layout


def test_random_draws_follow_the_weights() -> None:
    s = Split.fresh(["a", "b"], [90, 10])
    rng = random.Random(3)
    arms = Counter(s.target(bucket_of_draw(rng.random())) for _ in range(20_000))
    assert abs(arms["b"] / 20_000 - 0.10) < 0.01
