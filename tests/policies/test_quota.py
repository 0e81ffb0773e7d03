"""policies/quota.py: counter arithmetic, table-tested, and the "never past the limit" property
under any interleaving of takes and settles."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.quota import EMPTY, CounterState, debit, exceeds, refusing, remaining, settle, too_large, warn


@pytest.mark.parametrize(
    ("limit", "used", "amount", "refused", "large"),
    [
        (100, 0, 100, False, False),  # exactly the limit passes
        (100, 0, 101, True, True),  # larger than the whole quota: never
        (100, 60, 40, False, False),
        (100, 60, 41, True, False),  # would exceed: refused until the window ends
        (100, 100, 0, False, False),  # a zero amount always passes
        (100, 130, 0, True, False),  # over (an overrun was charged): even zero is refused
        (2_000_000, 1_999_999, 1, False, False),
    ],
)
def test_would_exceed(limit: float, used: float, amount: float, refused: bool, large: bool) -> None:
    assert exceeds(limit, used, amount) is refused
    assert too_large(limit, amount) is large
    assert refusing([(limit, CounterState(used), amount)]) == ((0,) if refused else ())


def test_refusing_names_every_counter_that_refuses() -> None:
    reqs = [(10.0, CounterState(5), 5.0), (10.0, CounterState(6), 5.0), (1.0, EMPTY, 2.0)]
    assert refusing(reqs) == (1, 2)


@pytest.mark.parametrize(
    ("state", "amount", "warn_level", "expected", "crossed"),
    [
        (EMPTY, 10, None, CounterState(10), False),
        (CounterState(70), 10, 80, CounterState(80, True), True),  # reaching the level crosses it
        (CounterState(70), 9, 80, CounterState(79), False),
        (CounterState(85, True), 10, 80, CounterState(95, True), False),  # once per window
        (CounterState(85, False), 0, 80, CounterState(85, True), True),  # level lowered under it
    ],
)
def test_debit_and_warn(
    state: CounterState, amount: float, warn_level: float | None, expected: CounterState, crossed: bool
) -> None:
    assert debit(state, amount, warn_level) == (expected, crossed)


@pytest.mark.parametrize(
    ("state", "reserved", "actual", "warn_level", "expected", "crossed"),
    [
        (CounterState(500), 300, 120, None, CounterState(320), False),  # the unused part comes back
        (CounterState(500), 300, 300, None, CounterState(500), False),
        (CounterState(500), 300, 350, 520, CounterState(550, True), True),  # an overrun, crossing
        (CounterState(100), 300, 0, None, CounterState(0), False),  # never below zero
        (None, 300, 120, 1, None, False),  # the window is over: nothing to settle into
        (CounterState(90, True), 10, 0, 80, CounterState(80, True), False),
    ],
)
def test_settle(
    state: CounterState | None,
    reserved: float,
    actual: float,
    warn_level: float | None,
    expected: CounterState | None,
    crossed: bool,
) -> None:
    assert settle(state, reserved, actual, warn_level) == (expected, crossed)


def test_negative_or_nan_amounts_are_refused() -> None:
    with pytest.raises(ValueError):
        debit(EMPTY, -1, None)
    with pytest.raises(ValueError):
        settle(EMPTY, float("nan"), 0, None)


def test_warn_without_level_never_fires() -> None:
    assert warn(CounterState(10**9), None) == (CounterState(10**9), False)


def test_remaining() -> None:
    assert remaining(100, 30) == 70 and remaining(100, 130) == 0


@given(
    st.integers(1, 10_000),
    st.lists(st.tuples(st.integers(0, 3_000), st.floats(0, 1), st.booleans()), max_size=60),
)
def test_reservations_never_pass_the_limit_and_usage_only_by_overruns(
    limit: int, events: list[tuple[int, float, bool]]
) -> None:
    """Interleave takes and settles at random: at every moment `used` (reservations of running
    requests + what ended requests used) stays within the limit when no request used more than it
    reserved."""
    state = EMPTY
    running: list[int] = []
    for amount, use, settle_one in events:
        if settle_one and running:
            reserved = running.pop(0)
            new, _ = settle(state, reserved, int(reserved * use), None)
            assert new is not None
            state = new
        elif not exceeds(limit, state.used, amount):
            state, _ = debit(state, amount, None)
            running.append(amount)
        assert state.used <= limit
