"""Token buckets in this process's memory: the default store, and the fail-open fallback for Redis.

State is a dict from (tenant, kind) to `BucketState` on the injected monotonic clock. Tenants come
from config, so the dict is bounded by the config's size and needs no expiry. No method awaits
anything, so each call runs to completion without yielding to the event loop: that is what makes the
read-modify-write atomic, and it costs the request path no scheduling round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateway.stores.base import Bucket, Level, Take
from policies.token_bucket import BucketState, refill, settle, take_all

SOURCE = "memory"


class MemoryBucketStore:
    """Buckets of one process. `source` names it in `Take.source` (a fallback store is "local")."""

    def __init__(self, clock: Callable[[], float], source: str = SOURCE) -> None:
        self._clock = clock
        self._states: dict[tuple[str, str], BucketState] = {}
        self.source = source

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def take_now(self, buckets: Sequence[Bucket], amounts: Sequence[float]) -> Take:
        """`take` without the coroutine, for callers that are not async."""
        now = self._clock()
        states = self._states
        keys = [(b.tenant, b.kind) for b in buckets]
        requests = []
        for b, k, a in zip(buckets, keys, amounts, strict=True):
            s = states.get(k)
            requests.append((b.spec, s if s is not None else BucketState.full(b.spec, now), a))
        result = take_all(requests, now)
        levels = []
        for k, s in zip(keys, result.states, strict=True):
            states[k] = s
            levels.append(s.level)
        return Take(
            result.allowed,
            result.retry_after_s,
            result.too_large,
            result.limiting,
            tuple(levels),
            result.reset_s,
            tuple(b.spec.capacity for b in buckets),
            self.source,
        )

    async def take(self, buckets: Sequence[Bucket], amounts: Sequence[float]) -> Take:
        return self.take_now(buckets, amounts)

    def settle_now(
        self, buckets: Sequence[Bucket], reserved: Sequence[float], actual: Sequence[float]
    ) -> tuple[Level, ...]:
        now = self._clock()
        out = []
        for b, r, a in zip(buckets, reserved, actual, strict=True):
            k = (b.tenant, b.kind)
            s = settle(b.spec, self._states.get(k) or BucketState.full(b.spec, now), r, a, now)
            self._states[k] = s
            out.append(_level(b, s))
        return tuple(out)

    async def settle(
        self,
        buckets: Sequence[Bucket],
        reserved: Sequence[float],
        actual: Sequence[float],
        source: str = SOURCE,
    ) -> tuple[Level, ...] | None:
        return self.settle_now(buckets, reserved, actual)

    def peek_now(self, buckets: Sequence[Bucket]) -> tuple[Level, ...]:
        now = self._clock()
        states = self._states
        return tuple(
            _level(b, refill(b.spec, states.get((b.tenant, b.kind)) or BucketState.full(b.spec, now), now))
            for b in buckets
        )

    async def peek(self, buckets: Sequence[Bucket]) -> tuple[tuple[Level, ...], str]:
        return self.peek_now(buckets), self.source


def _level(b: Bucket, s: BucketState) -> Level:
    return Level(s.level, (b.spec.capacity - s.level) / b.spec.refill_per_s, b.spec.capacity)
