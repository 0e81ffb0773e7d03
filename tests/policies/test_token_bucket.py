from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.token_bucket import (
    BucketSpec,
    BucketState,
    refill,
    reset_after,
    settle,
    take,
    take_all,
)

# 60 per minute, holds 10: one unit per second.
SPEC = BucketSpec(capacity=10.0, refill_per_s=1.0)


def test_per_minute_defaults_burst_to_the_minutes_amount() -> None:
    assert BucketSpec.per_minute(600) == BucketSpec(capacity=600, refill_per_s=10.0)
    assert BucketSpec.per_minute(600, burst=50) == BucketSpec(capacity=50, refill_per_s=10.0)


def test_scaled_is_a_share_of_both_capacity_and_rate() -> None:
    assert BucketSpec.per_minute(600).scaled(0.25) == BucketSpec(capacity=150, refill_per_s=2.5)
    with pytest.raises(ValueError):
        SPEC.scaled(0)


@pytest.mark.parametrize(
    ("capacity", "refill_per_s"),
    [(0, 1), (-1, 1), (10, 0), (10, -1), (math.inf, 1), (10, math.nan)],
)
def test_spec_refuses_degenerate_limits(capacity: float, refill_per_s: float) -> None:
    with pytest.raises(ValueError):
        BucketSpec(capacity, refill_per_s)


@pytest.mark.parametrize(
    ("state", "now", "expected"),
    [
        (BucketState(0, 100), 100, BucketState(0, 100)),  # no time, no tokens
        (BucketState(0, 100), 103.5, BucketState(3.5, 103.5)),
        (BucketState(4, 100), 200, BucketState(10, 200)),  # capped at capacity
        (BucketState(-5, 100), 102, BucketState(-3, 102)),  # debt refills like anything else
        (BucketState(2, 100), 90, BucketState(2, 100)),  # clock went back: nothing added, stamp kept
        (BucketState(12, 100), 100, BucketState(10, 100)),  # capacity lowered by config: clamped
    ],
)
def test_refill(state: BucketState, now: float, expected: BucketState) -> None:
    assert refill(SPEC, state, now) == expected


def test_clock_going_back_then_forward_credits_each_interval_once() -> None:
    s = refill(SPEC, BucketState(0, 100), 90)  # backwards
    s = refill(SPEC, s, 102)
    assert s == BucketState(2, 102)


@pytest.mark.parametrize(
    ("level", "amount", "allowed", "after", "retry_after_s", "too_large"),
    [
        (10, 1, True, 9, 0.0, False),
        (10, 10, True, 0, 0.0, False),  # exactly the capacity
        (3, 3, True, 0, 0.0, False),
        (3, 5, False, 3, 2.0, False),  # refused: unchanged, ready in 2 s
        (-4, 1, False, -4, 5.0, False),  # in debt: repay first
        (-4, 0, False, -4, 4.0, False),  # even a free request waits until the debt is gone
        (10, 11, False, 10, math.inf, True),  # never fits
        (10, 0, True, 10, 0.0, False),
    ],
)
def test_take(
    level: float, amount: float, allowed: bool, after: float, retry_after_s: float, too_large: bool
) -> None:
    r = take(SPEC, BucketState(level, 50), amount, now=50)
    assert r.allowed is allowed
    assert r.state == BucketState(after, 50)
    assert r.retry_after_s == retry_after_s
    assert r.too_large is too_large
    assert r.remaining == max(0, after)
    assert r.reset_s == 10 - after


def test_take_refills_before_deciding() -> None:
    r = take(SPEC, BucketState(0, 0), 4, now=5)
    assert r.allowed
    assert r.state == BucketState(1, 5)


def test_take_refuses_negative_amounts() -> None:
    with pytest.raises(ValueError):
        take(SPEC, BucketState(10, 0), -1, now=0)
    with pytest.raises(ValueError):
        take(SPEC, BucketState(10, 0), math.nan, now=0)


@pytest.mark.parametrize(
    ("level", "reserved", "actual", "expected"),
    [
        (2, 8, 3, 7),  # refund of the unused 5
        (2, 8, 8, 2),  # exact: nothing changes
        (2, 8, 0, 10),  # cancelled before any token: all back
        (9, 8, 0, 10),  # refund capped at capacity
        (2, 8, 13, -3),  # overrun of 5: debt
        (-3, 0, 4, -7),  # more debt
    ],
)
def test_settle(level: float, reserved: float, actual: float, expected: float) -> None:
    assert settle(SPEC, BucketState(level, 7), reserved, actual, now=7) == BucketState(expected, 7)


def test_settle_refills_first() -> None:
    assert settle(SPEC, BucketState(0, 0), reserved=5, actual=2, now=4) == BucketState(7, 4)


def test_debt_is_repaid_before_the_next_request_passes() -> None:
    spec = BucketSpec.per_minute(600)  # 10 tokens/s, holds 600
    r = take(spec, BucketState.full(spec, 0), 500, now=0)
    assert r.allowed
    s = settle(spec, r.state, reserved=500, actual=800, now=0)  # 300 more than reserved
    assert s.level == -200
    r2 = take(spec, s, 100, now=0)
    assert not r2.allowed
    assert r2.retry_after_s == pytest.approx(30.0)  # 300 tokens at 10/s
    assert take(spec, s, 100, now=30).allowed


@pytest.mark.parametrize(
    ("state", "now", "expected"),
    [
        (BucketState(10, 0), 0, 0.0),
        (BucketState(4, 0), 0, 6.0),
        (BucketState(4, 0), 2, 4.0),
        (BucketState(-5, 0), 0, 15.0),
        (BucketState(0, 0), 100, 0.0),
    ],
)
def test_reset_after(state: BucketState, now: float, expected: float) -> None:
    assert reset_after(SPEC, state, now) == expected


def test_reset_duration_of_a_tokens_per_minute_limit() -> None:
    spec = BucketSpec.per_minute(200_000)
    r = take(spec, BucketState.full(spec, 0), 20_000, now=0)
    assert r.reset_s == pytest.approx(6.0)  # a tenth of the minute's tokens


TOKENS = BucketSpec.per_minute(6000)  # 100 tokens/s, holds 6000
REQUESTS = BucketSpec.per_minute(60)  # 1 request/s, holds 60


@pytest.mark.parametrize(
    ("req_level", "tok_level", "tokens", "allowed", "limiting", "retry_after_s", "too_large"),
    [
        (60, 6000, 500, True, (), 0.0, False),
        (0.5, 6000, 500, False, (0,), 0.5, False),  # requests limit hit
        (60, 100, 500, False, (1,), 4.0, False),  # tokens limit hit
        (0, 0, 500, False, (0, 1), 5.0, False),  # both: the later of the two
        (60, 6000, 7000, False, (1,), math.inf, True),  # can never pass
    ],
)
def test_take_all_is_all_or_nothing(
    req_level: float,
    tok_level: float,
    tokens: float,
    allowed: bool,
    limiting: tuple[int, ...],
    retry_after_s: float,
    too_large: bool,
) -> None:
    before = (BucketState(req_level, 0), BucketState(tok_level, 0))
    r = take_all([(REQUESTS, before[0], 1), (TOKENS, before[1], tokens)], now=0)
    assert r.allowed is allowed
    assert r.limiting == limiting
    assert r.retry_after_s == retry_after_s
    assert r.too_large is too_large
    if allowed:
        assert r.states == (BucketState(req_level - 1, 0), BucketState(tok_level - tokens, 0))
    else:
        assert r.states == before  # neither bucket was touched
    assert r.remaining == tuple(max(0.0, s.level) for s in r.states)
    assert r.reset_s == (reset_after(REQUESTS, r.states[0], 0), reset_after(TOKENS, r.states[1], 0))


def test_take_all_of_nothing_is_allowed() -> None:
    r = take_all([], now=0)
    assert r.allowed and r.states == () and r.retry_after_s == 0.0


# --- invariants -------------------------------------------------------------------------------

levels = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False)
times = st.floats(min_value=0, max_value=1e5, allow_nan=False)
amounts = st.floats(min_value=0, max_value=2e3, allow_nan=False)
specs = st.builds(
    BucketSpec,
    capacity=st.floats(min_value=1, max_value=1e3),
    refill_per_s=st.floats(min_value=0.01, max_value=1e3),
)
ops = st.lists(
    st.tuples(st.sampled_from(["take", "settle", "refill"]), times, amounts, amounts), max_size=30
)


@given(specs, levels, times, ops)
def test_level_never_exceeds_capacity(
    spec: BucketSpec, level: float, t0: float, steps: list[tuple[str, float, float, float]]
) -> None:
    s = BucketState(min(level, spec.capacity), t0)
    for op, now, a, b in steps:
        if op == "take":
            s = take(spec, s, a, now).state
        elif op == "settle":
            s = settle(spec, s, a, b, now)
        else:
            s = refill(spec, s, now)
        assert s.level <= spec.capacity
        assert reset_after(spec, s, now) >= 0


@given(specs, levels, times, amounts)
def test_a_refused_take_passes_once_retry_after_has_elapsed(
    spec: BucketSpec, level: float, now: float, amount: float
) -> None:
    s = BucketState(min(level, spec.capacity), now)
    r = take(spec, s, amount, now)
    if r.allowed:
        assert r.state.level == pytest.approx(s.level - amount)
    elif r.too_large:
        assert amount > spec.capacity
    else:
        assert r.state == s
        later = now + r.retry_after_s
        # The slack covers float rounding of `now + retry_after_s` only.
        assert take(spec, s, amount, later + 1e-9 * max(1.0, later)).allowed
        if r.retry_after_s * 0.01 > 1e-6 * max(1.0, now):  # a gap the float clock can resolve
            assert not take(spec, s, amount, now + r.retry_after_s * 0.99).allowed


@given(st.lists(st.tuples(st.floats(min_value=0, max_value=20), st.floats(min_value=0, max_value=30)),
                max_size=60))
def test_admitted_amount_never_exceeds_capacity_plus_refill(steps: list[tuple[float, float]]) -> None:
    spec = BucketSpec(capacity=100, refill_per_s=10)
    s = BucketState.full(spec, 0)
    now = 0.0
    admitted = 0.0
    for dt, amount in steps:
        now += dt
        r = take(spec, s, amount, now)
        s = r.state
        admitted += amount if r.allowed else 0.0
    assert admitted <= spec.capacity + spec.refill_per_s * now + 1e-6


@given(st.lists(st.tuples(specs, levels, amounts), min_size=1, max_size=4), times)
def test_take_all_takes_from_all_or_none(
    buckets: list[tuple[BucketSpec, float, float]], now: float
) -> None:
    requests = [
        (spec, BucketState(min(level, spec.capacity), now), amount) for spec, level, amount in buckets
    ]
    r = take_all(requests, now)
    singles = [take(spec, state, amount, now) for spec, state, amount in requests]
    assert r.allowed == all(x.allowed for x in singles)
    assert r.limiting == tuple(i for i, x in enumerate(singles) if not x.allowed)
    for (_, state, _), single, got in zip(requests, singles, r.states, strict=True):
        assert got == (single.state if r.allowed else state)
    assert r.retry_after_s == max(x.retry_after_s for x in singles)
