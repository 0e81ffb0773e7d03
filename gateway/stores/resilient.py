"""Redis first; when Redis cannot answer, the configured failure mode; back to Redis by itself.

- Healthy: every call goes to Redis (one script call, bounded by `state.timeout_s`).
- A call fails (timeout, refused, reset, script error): the store is marked DOWN, the failure is
  counted (`kvgate_state_store_errors_total{op}`), and that same call is answered by the failure
  mode. While down, calls do not touch Redis at all (a dead server costs requests nothing), and one
  background probe PINGs it with exponential backoff and jitter (`probe_min_s` doubling up to
  `probe_max_s`), so N gateways do not hammer a recovering server. The first good PING reloads the
  script and marks the store UP again.
- Fail-open (`on_store_error: open`): takes go to local in-memory buckets holding this gateway's
  share of each limit (`1 / (state.gateways x server.workers)` of both the capacity and the
  refill: every process sharing the limits is one share), so the N gateway processes
  together still admit about one limit. Quota counters likewise: a local counter per window holding
  this gateway's share of what was left of the quota when this gateway last saw the shared counter
  (`(limit - used last seen) / gateways`; the whole limit's share for a counter never seen), so
  together they admit about what was left. What is used locally is not copied back to Redis when it
  answers again: after an outage a quota can be passed by at most what its tenant used during it,
  which is itself bounded by what was left. Warnings are not raised from local counters.
  Fail-closed (`closed`): takes raise `StoreUnavailable`, which the gateway answers 503.
- Settles follow their reservation: one taken locally is settled locally (even after Redis is back);
  one taken in Redis is settled in Redis, and if Redis is down at that moment the settle is DROPPED
  and counted (`kvgate_state_settles_dropped_total`): the Redis bucket then keeps the whole
  reservation charged (never more than the request's reservation), which its refill repays. Applying
  it to the local buckets instead would credit them tokens they never lent.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Sequence

from redis.exceptions import RedisError

from gateway.metrics import GatewayMetrics
from gateway.stores.base import (
    NO_AMOUNTS,
    NO_COUNTERS,
    Bucket,
    Counter,
    Level,
    Settled,
    StoreUnavailable,
    Take,
)
from gateway.stores.memory import MemoryBucketStore
from gateway.stores.redis_store import RedisBucketStore

log = logging.getLogger(__name__)

LOCAL = "local"
_FAILURES = (RedisError, OSError, TimeoutError)


class ResilientStore:
    """The Redis store wrapped in the failure policy. One event loop; the probe is its own task."""

    def __init__(
        self,
        remote: RedisBucketStore,
        local: MemoryBucketStore,
        *,
        fail_open: bool,
        share: float,
        timeout_s: float,
        probe_min_s: float,
        probe_max_s: float,
        metrics: GatewayMetrics,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError("share must be in (0, 1]")
        self._remote = remote
        self._local = local
        self._fail_open = fail_open
        self._share = share
        self._timeout_s = timeout_s
        self._probe_min = probe_min_s
        self._probe_max = max(probe_min_s, probe_max_s)
        self._delay = probe_min_s
        self._m = metrics
        self._rng = rng or random.Random()
        self._scaled: dict[Bucket, Bucket] = {}
        self._seen_used: dict[tuple[str, str], float] = {}  # counters' `used` in the last Redis reply
        self._probe: asyncio.Task[None] | None = None
        self.up = True
        metrics.store_up.set(1)

    @property
    def fail_open(self) -> bool:
        return self._fail_open

    async def start(self) -> None:
        try:
            await self._remote.start()
        except _FAILURES as err:
            self._mark_down("start", err)

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
            self._probe = None
        await self._remote.close()

    async def take(
        self,
        buckets: Sequence[Bucket],
        amounts: Sequence[float],
        counters: Sequence[Counter] = NO_COUNTERS,
        counter_amounts: Sequence[float] = NO_AMOUNTS,
    ) -> Take:
        if self.up:
            try:
                take = await self._remote.take(buckets, amounts, counters, counter_amounts)
            except _FAILURES as err:
                self._mark_down("take", err)
            else:
                self._see(counters, take.used)
                return take
        if self._fail_open:
            return self._local.take_now(
                self._share_of(buckets), amounts, self._counter_share(counters), counter_amounts
            )
        raise StoreUnavailable(self._delay)

    async def settle(
        self,
        buckets: Sequence[Bucket],
        reserved: Sequence[float],
        actual: Sequence[float],
        source: str,
        counters: Sequence[Counter] = NO_COUNTERS,
        counter_reserved: Sequence[float] = NO_AMOUNTS,
        counter_actual: Sequence[float] = NO_AMOUNTS,
    ) -> Settled | None:
        if source == LOCAL:
            return self._local.settle_now(
                self._share_of(buckets),
                reserved,
                actual,
                self._counter_share(counters),
                counter_reserved,
                counter_actual,
            )
        if self.up:
            try:
                settled = await self._remote.settle(
                    buckets, reserved, actual, source, counters, counter_reserved, counter_actual
                )
            except _FAILURES as err:
                self._mark_down("settle", err)
            else:
                if settled is not None:
                    self._see(counters, settled.used)
                return settled
        self._m.settles_dropped.inc()
        return None

    async def peek_counters(self, counters: Sequence[Counter]) -> tuple[tuple[float, ...], str]:
        if self.up:
            try:
                return await self._remote.peek_counters(counters)
            except _FAILURES as err:
                self._mark_down("peek", err)
        if self._fail_open:
            return self._local.peek_counters_now(self._counter_share(counters)), LOCAL
        raise StoreUnavailable(self._delay)

    async def peek(self, buckets: Sequence[Bucket]) -> tuple[tuple[Level, ...], str]:
        if self.up:
            try:
                return await self._remote.peek(buckets)
            except _FAILURES as err:
                self._mark_down("peek", err)
        if self._fail_open:
            return self._local.peek_now(self._share_of(buckets)), LOCAL
        raise StoreUnavailable(self._delay)

    def _share_of(self, buckets: Sequence[Bucket]) -> list[Bucket]:
        if self._share == 1.0:
            return list(buckets)
        out = []
        for b in buckets:
            s = self._scaled.get(b)
            if s is None:
                s = self._scaled[b] = Bucket(b.tenant, b.kind, b.spec.scaled(self._share), b.key)
            out.append(s)
        return out

    def _see(self, counters: Sequence[Counter], used: Sequence[float]) -> None:
        for c, u in zip(counters, used, strict=True):
            self._seen_used[(c.tenant, c.name)] = u

    def _counter_share(self, counters: Sequence[Counter]) -> list[Counter]:
        """Local stand-ins: this gateway's share of what was left when Redis last answered; no
        warnings (a warning is once per window across gateways, which needs the shared counter)."""
        out = []
        for c in counters:
            left = max(0.0, c.limit - self._seen_used.get((c.tenant, c.name), 0.0))
            out.append(Counter(c.tenant, c.name, left * self._share, c.expires_at, None))
        return out

    def _mark_down(self, op: str, err: BaseException) -> None:
        self._m.store_errors.labels(op).inc()
        if not self.up:
            return
        self.up = False
        self._m.store_up.set(0)
        mode = "local buckets with this gateway's share" if self._fail_open else "refusing (503)"
        log.warning(
            "rate limit store unreachable on %s (%s: %s); %s until it answers again",
            op,
            type(err).__name__,
            err,
            mode,
        )
        if self._probe is None or self._probe.done():
            self._delay = self._probe_min
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        while True:
            # +-25 % jitter: gateways that lost Redis together must not probe in lockstep
            await asyncio.sleep(self._delay * (0.75 + 0.5 * self._rng.random()))
            try:
                await self._remote.ping()
                await self._remote.start()
            except _FAILURES:
                self._delay = min(self._delay * 2, self._probe_max)
                continue
            self.up = True
            self._delay = self._probe_min
            self._m.store_up.set(1)
            log.warning("rate limit store answers again; limits are shared through it again")
            return


def retry_after_s(err: StoreUnavailable) -> int:
    """Whole seconds to advertise while the store is down: when the next probe may succeed."""
    return max(1, math.ceil(err.retry_after_s))
