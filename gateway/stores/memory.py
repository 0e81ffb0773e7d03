"""Token buckets and quota counters in this process's memory: the default store, and the fail-open
fallback for Redis.

Buckets: a dict from (tenant, bucket name) to `BucketState` on the injected monotonic clock. Tenants
and keys come from config or the admin API, so it is bounded by them and needs no expiry.
Counters: a dict from (tenant, counter name) to `CounterState` and the time it may go (`expires_at`,
on the injected wall clock); windows that are over are swept at most once a minute, so it holds the
current window of each quota plus those still in their grace.

No method awaits anything, so each call runs to completion without yielding to the event loop: that
is what makes the read-modify-write atomic, and it costs the request path no scheduling round.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from gateway.stores.base import NO_AMOUNTS, NO_COUNTERS, Bucket, Counter, Level, Settled, Take
from policies import quota
from policies.quota import EMPTY, CounterState
from policies.token_bucket import BucketState, refill, settle, take_all

SOURCE = "memory"
_SWEEP_EVERY_S = 60.0


class MemoryBucketStore:
    """Buckets and counters of one process. `source` names it in `Take.source` (a fallback store is
    "local")."""

    def __init__(
        self,
        clock: Callable[[], float],
        source: str = SOURCE,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._wall = wall_clock
        self._states: dict[tuple[str, str], BucketState] = {}
        self._counters: dict[tuple[str, str], tuple[CounterState, float]] = {}
        self._next_sweep = 0.0
        self.source = source

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def take_now(
        self,
        buckets: Sequence[Bucket],
        amounts: Sequence[float],
        counters: Sequence[Counter] = NO_COUNTERS,
        counter_amounts: Sequence[float] = NO_AMOUNTS,
    ) -> Take:
        """`take` without the coroutine, for callers that are not async."""
        now = self._clock()
        states = self._states
        keys = [b.id for b in buckets]
        requests = []
        for b, k, a in zip(buckets, keys, amounts, strict=True):
            s = states.get(k)
            requests.append((b.spec, s if s is not None else BucketState.full(b.spec, now), a))
        cstates: list[CounterState] = []
        refusing: list[int] = []
        if counters:
            wall = self._wall()
            if wall >= self._next_sweep:
                self._sweep(wall)
            held = self._counters
            for i, (c, a) in enumerate(zip(counters, counter_amounts, strict=True)):
                entry = held.get(c.id)
                cs = entry[0] if entry is not None and entry[1] > wall else EMPTY
                cstates.append(cs)
                if quota.exceeds(c.limit, cs.used, a):
                    refusing.append(i)
        result = take_all(requests, now, others_pass=not refusing)
        levels = []
        for k, s in zip(keys, result.states, strict=True):
            states[k] = s
            levels.append(s.level)
        crossed: list[int] = []
        if result.allowed:
            for i, (c, a) in enumerate(zip(counters, counter_amounts, strict=True)):
                cstates[i], hit = quota.debit(cstates[i], a, c.warn_level)
                self._counters[c.id] = (cstates[i], c.expires_at)
                if hit:
                    crossed.append(i)
        return Take(
            result.allowed,
            result.retry_after_s,
            result.too_large,
            result.limiting,
            tuple(levels),
            result.reset_s,
            tuple(b.spec.capacity for b in buckets),
            self.source,
            tuple([s.used for s in cstates]) if cstates else (),
            tuple(refusing),
            tuple(crossed),
        )

    async def take(
        self,
        buckets: Sequence[Bucket],
        amounts: Sequence[float],
        counters: Sequence[Counter] = NO_COUNTERS,
        counter_amounts: Sequence[float] = NO_AMOUNTS,
    ) -> Take:
        return self.take_now(buckets, amounts, counters, counter_amounts)

    def settle_now(
        self,
        buckets: Sequence[Bucket],
        reserved: Sequence[float],
        actual: Sequence[float],
        counters: Sequence[Counter] = NO_COUNTERS,
        counter_reserved: Sequence[float] = NO_AMOUNTS,
        counter_actual: Sequence[float] = NO_AMOUNTS,
    ) -> Settled:
        now = self._clock()
        out = []
        for b, r, a in zip(buckets, reserved, actual, strict=True):
            k = b.id
            s = settle(b.spec, self._states.get(k) or BucketState.full(b.spec, now), r, a, now)
            self._states[k] = s
            out.append(_level(b, s))
        used: list[float] = []
        crossed: list[int] = []
        if counters:
            wall = self._wall()
            for i, (c, r, a) in enumerate(zip(counters, counter_reserved, counter_actual, strict=True)):
                state, hit = quota.settle(self._counter(c, wall), r, a, c.warn_level)
                if state is not None:
                    self._counters[c.id] = (state, c.expires_at)
                used.append(state.used if state is not None else 0.0)
                if hit:
                    crossed.append(i)
        return Settled(tuple(out), tuple(used), tuple(crossed))

    async def settle(
        self,
        buckets: Sequence[Bucket],
        reserved: Sequence[float],
        actual: Sequence[float],
        source: str = SOURCE,
        counters: Sequence[Counter] = NO_COUNTERS,
        counter_reserved: Sequence[float] = NO_AMOUNTS,
        counter_actual: Sequence[float] = NO_AMOUNTS,
    ) -> Settled | None:
        return self.settle_now(buckets, reserved, actual, counters, counter_reserved, counter_actual)

    def peek_now(self, buckets: Sequence[Bucket]) -> tuple[Level, ...]:
        now = self._clock()
        states = self._states
        return tuple(
            _level(b, refill(b.spec, states.get(b.id) or BucketState.full(b.spec, now), now)) for b in buckets
        )

    async def peek(self, buckets: Sequence[Bucket]) -> tuple[tuple[Level, ...], str]:
        return self.peek_now(buckets), self.source

    def peek_counters_now(self, counters: Sequence[Counter]) -> tuple[float, ...]:
        wall = self._wall()
        return tuple((self._counter(c, wall) or EMPTY).used for c in counters)

    async def peek_counters(self, counters: Sequence[Counter]) -> tuple[tuple[float, ...], str]:
        return self.peek_counters_now(counters), self.source

    def _counter(self, c: Counter, wall: float) -> CounterState | None:
        """The counter's state, or None when missing or its lifetime is over (as Redis's expiry)."""
        entry = self._counters.get(c.id)
        if entry is None or entry[1] <= wall:
            return None
        return entry[0]

    def _sweep(self, wall: float) -> None:
        self._next_sweep = wall + _SWEEP_EVERY_S
        for k in [k for k, (_, expires_at) in self._counters.items() if expires_at <= wall]:
            del self._counters[k]


def _level(b: Bucket, s: BucketState) -> Level:
    return Level(s.level, (b.spec.capacity - s.level) / b.spec.refill_per_s, b.spec.capacity)
