"""Token bucket arithmetic for per-tenant limits (requests per minute, tokens per minute).

Pure functions over a frozen `(level, updated_at)` state: the caller's store (memory, or Redis through
one Lua script per check) loads the state, calls these, and writes the returned state back. Nothing
here reads a clock; `now` is seconds on ONE clock shared by every writer of a key (for Redis, read it
inside the script with `redis.call('TIME')` so several gateways agree; a process's monotonic clock is
enough for the memory store).

Units: `level`, `amount`, `capacity` are in the bucket's unit (requests or tokens), floats;
`refill_per_s` is units per second; times are seconds.

The arithmetic, exactly (a Lua script mirrors it line by line; Lua numbers are IEEE doubles too):

    -- missing state (new key, or a key that expired) means FULL:
    if state == nil then level = capacity; updated_at = now end

    -- refill(now): a clock that goes backwards adds nothing and does not move updated_at back,
    -- so the same interval is never credited twice.
    elapsed = now - updated_at
    if elapsed < 0 then elapsed = 0 end
    level = math.min(capacity, level + elapsed * refill_per_s)
    updated_at = math.max(updated_at, now)

    -- take(amount, now), amount >= 0: refill, then all or nothing.
    if amount > capacity then            -- can never pass: "request too large for this limit"
        allowed = false; too_large = true; retry_after = math.huge
    elseif level >= amount then
        allowed = true; level = level - amount; retry_after = 0
    else
        allowed = false; retry_after = (amount - level) / refill_per_s
    end
    remaining = math.max(0, level)                    -- after the decision
    reset = (capacity - level) / refill_per_s         -- seconds until full again

    -- take_all({(spec_i, state_i, amount_i)}, now, others_pass): refill every bucket; the request
    -- passes only if EVERY bucket passes on its own and `others_pass` (the verdict of the other limits
    -- checked in the same atomic step: the request's quota counters, policies/quota.py); then each
    -- bucket is debited, otherwise none is.
    -- retry_after = max of the refusing buckets' retry_after (each only grows, so at that time all
    -- hold enough at once); math.huge when any bucket is too small for its amount.

    -- settle(reserved, actual, now): refill, then return the unused reservation (or charge the
    -- overrun when actual > reserved; level may go below 0 = debt, repaid by refill before the
    -- tenant's next take can pass).
    level = math.min(capacity, level + (reserved - actual))

A key can be given a TTL of `ceil(reset) + 1` seconds after each write: once the bucket would be full
again, a missing key (= full) is the same state, so expiry loses nothing. Store the two numbers with
`string.format('%.17g', x)`: Lua's `tostring` keeps only 14 significant digits, and the rounding
would drift the level a little on every write. Return fractional results (retry_after, remaining,
reset) as such strings too: Redis turns a Lua number in a script's reply into an integer (and
`math.huge` has no integer). With `redis.call('TIME')`, `now = sec + usec / 1e6`.

Concurrency: the functions are pure; atomicity is the store's job (one event loop for memory, one Lua
script for Redis). A read-modify-write split over two Redis calls would break the "all or nothing" and
the cap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """A limit: holds at most `capacity` units, refilled continuously at `refill_per_s` (> 0)."""

    capacity: float
    refill_per_s: float

    def __post_init__(self) -> None:
        if not (self.capacity > 0 and math.isfinite(self.capacity)):
            raise ValueError(f"capacity must be a positive finite number, got {self.capacity!r}")
        if not (self.refill_per_s > 0 and math.isfinite(self.refill_per_s)):
            raise ValueError(f"refill_per_s must be a positive finite number, got {self.refill_per_s!r}")

    @classmethod
    def per_minute(cls, limit: float, burst: float | None = None) -> BucketSpec:
        """`limit` units per minute; the bucket holds `burst` (default: one minute's amount)."""
        return cls(capacity=limit if burst is None else burst, refill_per_s=limit / 60.0)

    def scaled(self, fraction: float) -> BucketSpec:
        """The same limit cut to `fraction` of itself, e.g. one gateway's share when Redis is down
        and each of N gateways falls back to local buckets (`fraction = 1 / N`)."""
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
        return BucketSpec(self.capacity * fraction, self.refill_per_s * fraction)


@dataclass(frozen=True, slots=True)
class BucketState:
    """Stored state of one bucket. `level` may be negative (debt from an overrun), never above the
    spec's capacity once refilled. `updated_at` is seconds on the store's clock."""

    level: float
    updated_at: float

    @classmethod
    def full(cls, spec: BucketSpec, now: float) -> BucketState:
        """The state of a bucket never seen before (or whose key expired)."""
        return cls(spec.capacity, now)


@dataclass(frozen=True, slots=True)
class TakeResult:
    """Outcome of `take`. `state` is what to store (refilled, and debited only when `allowed`).

    `retry_after_s`: 0 when allowed; else seconds until the bucket holds `amount`; `math.inf` with
    `too_large` set when `amount` exceeds the capacity (waiting never helps: answer "request too large
    for the limit", without Retry-After). `remaining` (>= 0) and `reset_s` (seconds until full) describe
    `state`, for the `x-ratelimit-*` headers.
    """

    allowed: bool
    state: BucketState
    retry_after_s: float
    remaining: float
    reset_s: float
    too_large: bool = False


@dataclass(frozen=True, slots=True)
class MultiTakeResult:
    """Outcome of `take_all`, per bucket in the order given.

    `states` are what to store (all debited when `allowed`, none otherwise). `limiting` holds the
    indexes of the buckets that could not pass on their own (empty when allowed): the 429 message names
    them. `too_large` is set when any of them can never pass; then `retry_after_s` is `math.inf`.
    """

    allowed: bool
    states: tuple[BucketState, ...]
    retry_after_s: float
    remaining: tuple[float, ...]
    reset_s: tuple[float, ...]
    limiting: tuple[int, ...]
    too_large: bool = False


def refill(spec: BucketSpec, state: BucketState, now: float) -> BucketState:
    """The state at `now`: refilled for the time since `updated_at`, capped at capacity."""
    elapsed = now - state.updated_at
    if elapsed < 0:
        elapsed = 0.0
    return BucketState(min(spec.capacity, state.level + elapsed * spec.refill_per_s),
                       max(state.updated_at, now))


def _reset_s(spec: BucketSpec, level: float) -> float:
    return (spec.capacity - level) / spec.refill_per_s


def _shortfall_s(spec: BucketSpec, level: float, amount: float) -> float:
    """Seconds until a bucket at `level` holds `amount`: 0 if it already does, inf if it never can."""
    if amount > spec.capacity:
        return math.inf
    if level >= amount:
        return 0.0
    return (amount - level) / spec.refill_per_s


def _check_amount(amount: float) -> None:
    if not amount >= 0:  # also refuses NaN
        raise ValueError(f"amount must be >= 0, got {amount!r}")


def take(spec: BucketSpec, state: BucketState, amount: float, now: float) -> TakeResult:
    """Take `amount` (>= 0) units at `now`, all or nothing; see the module docstring."""
    _check_amount(amount)
    s = refill(spec, state, now)
    wait = _shortfall_s(spec, s.level, amount)
    if wait == 0.0:
        s = BucketState(s.level - amount, s.updated_at)
    return TakeResult(
        allowed=wait == 0.0,
        state=s,
        retry_after_s=wait,
        remaining=max(0.0, s.level),
        reset_s=_reset_s(spec, s.level),
        too_large=wait == math.inf,
    )


def take_all(
    requests: Sequence[tuple[BucketSpec, BucketState, float]], now: float, others_pass: bool = True
) -> MultiTakeResult:
    """Take from every `(spec, state, amount)` bucket at `now`, or from none (e.g. the requests bucket
    and the tokens bucket of one tenant). Buckets are independent: each is refilled on its own.
    `others_pass` False (a quota in the same atomic step refused) debits none and refuses, with
    `limiting` naming only the buckets that refused on their own."""
    # One pass for the refills and the verdict, a second only to debit: this runs on every request.
    levels: list[float] = []
    stamps: list[float] = []
    limiting: list[int] = []
    retry_after_s = 0.0
    for i, (spec, state, amount) in enumerate(requests):
        _check_amount(amount)
        s = refill(spec, state, now)
        wait = _shortfall_s(spec, s.level, amount)
        if wait > 0.0:
            limiting.append(i)
            retry_after_s = max(retry_after_s, wait)
        levels.append(s.level)
        stamps.append(s.updated_at)
    allowed = not limiting and others_pass
    if allowed:
        levels = [level - amount for level, (_, _, amount) in zip(levels, requests, strict=True)]
    return MultiTakeResult(
        allowed=allowed,
        states=tuple(map(BucketState, levels, stamps)),
        retry_after_s=retry_after_s,
        remaining=tuple(level if level > 0.0 else 0.0 for level in levels),
        reset_s=tuple(_reset_s(spec, level) for (spec, _, _), level in zip(requests, levels, strict=True)),
        limiting=tuple(limiting),
        too_large=retry_after_s == math.inf,
    )


def settle(spec: BucketSpec, state: BucketState, reserved: float, actual: float, now: float) -> BucketState:
    """Reconcile a reservation with real usage at `now`: give back `reserved - actual` (a refund when
    positive, an extra charge when negative, which may leave the level below zero as debt). Never
    above capacity. `reserved` and `actual` are >= 0, in the bucket's unit."""
    _check_amount(reserved)
    _check_amount(actual)
    s = refill(spec, state, now)
    return BucketState(min(spec.capacity, s.level + (reserved - actual)), s.updated_at)


def reset_after(spec: BucketSpec, state: BucketState, now: float) -> float:
    """Seconds from `now` until the bucket is full again (0 when full), for `x-ratelimit-reset-*`."""
    return _reset_s(spec, refill(spec, state, now).level)
