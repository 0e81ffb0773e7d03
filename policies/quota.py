"""Quota counters: how much of a calendar window's allowance a tenant (or one of its keys) has used.

Pure functions over a frozen `(used, warned)` state, as `policies.token_bucket` is for the buckets:
the store (memory, or Redis through `gateway/stores/quota.lua`, which mirrors this line by line)
loads the state, calls these, and writes the result back, in the SAME atomic step as the buckets'
take, so one admission is one store call.

Units: `used`, `limit`, `amount`, `reserved`, `actual` are in the quota's unit (tokens or requests),
floats holding whole numbers (exact up to 2**53). One counter is one quota in one window
(`policies.quota_window`); a new window is a new, missing counter.

The arithmetic, exactly:

    -- a missing counter (new window, or a key that expired after its window) is EMPTY:
    if state == nil then used = 0; warned = false end

    -- take(limit, amount): "would this exceed?", checked for every counter of the request
    if used + amount > limit then refused end     -- until the window ends (amount > limit: never)
    -- ... and only when every counter AND every token bucket of the request passes:
    used = used + amount

    -- settle(reserved, actual) when the request has ended:
    if state == nil then nothing                  -- its window is over and its key has expired
    else used = math.max(0, used + (actual - reserved)) end

    -- warn(warn_level), after a take or a settle that wrote the counter: the first time `used`
    -- reaches `warn_level` in this window (warn_at x limit), `warned` is set and the crossing is
    -- reported, once, to whichever gateway made the write.

Why usage stays within the limit: a take passes only if `used + amount <= limit`, and `used` holds
every running request's reservation, so reservations never add up past the limit, however many
requests run at once on however many gateways sharing the counter. Usage passes the limit only by
overruns charged at settle (`actual > reserved`), which happen only when the prompt's tokens were
estimated (no tokenizer for the model) or a broken stream was charged its estimate (at most one
token over): with a tokenizer, a quota is never exceeded. `used` counts the reservations of running
requests, so a warning may come a little early, never late.

Concurrency: the functions are pure; atomicity is the store's job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CounterState:
    """Stored state of one counter. `used` >= 0 includes running requests' reservations; `warned`
    says the warn level was already reported in this window."""

    used: float = 0.0
    warned: bool = False


EMPTY = CounterState()


def exceeds(limit: float, used: float, amount: float) -> bool:
    """Would taking `amount` pass `limit`?"""
    return used + amount > limit


def too_large(limit: float, amount: float) -> bool:
    """Can `amount` never pass, in any window (a request larger than the whole quota)?"""
    return amount > limit


def refusing(requests: Sequence[tuple[float, CounterState, float]]) -> tuple[int, ...]:
    """Indexes of the `(limit, state, amount)` counters that refuse their amount (empty: all pass)."""
    return tuple(i for i, (limit, s, amount) in enumerate(requests) if s.used + amount > limit)


def warn(state: CounterState, warn_level: float | None) -> tuple[CounterState, bool]:
    """The state with the warning noted, and whether this write crossed `warn_level` (None: no
    warning for this quota)."""
    if warn_level is None or state.warned or state.used < warn_level:
        return state, False
    return CounterState(state.used, True), True


def debit(state: CounterState, amount: float, warn_level: float | None) -> tuple[CounterState, bool]:
    """Add an admitted request's `amount` (>= 0); returns the new state and whether it crossed.
    (`warn` written out: this runs for every counter of every admitted request.)"""
    _check(amount)
    used = state.used + amount
    if warn_level is None or state.warned or used < warn_level:
        return CounterState(used, state.warned), False
    return CounterState(used, True), True


def settle(
    state: CounterState | None, reserved: float, actual: float, warn_level: float | None
) -> tuple[CounterState | None, bool]:
    """Reconcile a reservation with the real use: `used += actual - reserved`, never below 0.
    A missing counter stays missing (its window is over)."""
    _check(reserved)
    _check(actual)
    if state is None:
        return None, False
    return warn(CounterState(max(0.0, state.used + (actual - reserved)), state.warned), warn_level)


def remaining(limit: float, used: float) -> float:
    """What is left to take in the window, >= 0."""
    return max(0.0, limit - used)


def _check(amount: float) -> None:
    if not amount >= 0:  # also refuses NaN
        raise ValueError(f"amount must be >= 0, got {amount!r}")
