"""RateLimiter when the rate-limit store does not answer: fail-closed refuses with 503 and the probe
delay as Retry-After, fail-open admits on this gateway's share, and a settle that finds Redis down is
dropped (the reservation stays charged), through the real ResilientStore around a Redis stand-in."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gateway.metrics import GatewayMetrics
from gateway.rate_limit import RateLimiter
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
from gateway.stores.resilient import LOCAL, ResilientStore
from tests.gateway.stores.fakes import FakeClock
from tests.gateway.test_rate_limit import acme, levels, refused, rejections, request


class DownableRedis(RedisBucketStore):
    """Stands in for the Redis store (no server, no client): answers from memory while `up`, and
    fails every call the way a refused connection does while not."""

    def __init__(self, clock: FakeClock) -> None:  # no super().__init__: there is no client to make
        self._mem = MemoryBucketStore(clock, source="redis")
        self.up = True

    def _check(self) -> None:
        if not self.up:
            raise ConnectionRefusedError("fake redis is down")

    async def start(self) -> None:
        self._check()

    async def close(self) -> None:
        return None

    async def ping(self) -> None:
        self._check()

    async def take(
        self,
        buckets: Sequence[Bucket],
        amounts: Sequence[float],
        counters: Sequence[Counter] = NO_COUNTERS,
        counter_amounts: Sequence[float] = NO_AMOUNTS,
    ) -> Take:
        self._check()
        return self._mem.take_now(buckets, amounts, counters, counter_amounts)

    async def settle(
        self,
        buckets: Sequence[Bucket],
        reserved: Sequence[float],
        actual: Sequence[float],
        source: str = "redis",
        counters: Sequence[Counter] = NO_COUNTERS,
        counter_reserved: Sequence[float] = NO_AMOUNTS,
        counter_actual: Sequence[float] = NO_AMOUNTS,
    ) -> Settled | None:
        self._check()
        return self._mem.settle_now(buckets, reserved, actual, counters, counter_reserved, counter_actual)

    async def peek(self, buckets: Sequence[Bucket]) -> tuple[tuple[Level, ...], str]:
        self._check()
        return self._mem.peek_now(buckets), "redis"

    async def peek_counters(self, counters: Sequence[Counter]) -> tuple[tuple[float, ...], str]:
        self._check()
        return self._mem.peek_counters_now(counters), "redis"


def resilient(clock: FakeClock, *, fail_open: bool, gateways: int = 4) -> tuple[RateLimiter, DownableRedis]:
    remote = DownableRedis(clock)
    metrics = GatewayMetrics()
    store = ResilientStore(
        remote,
        MemoryBucketStore(clock, source=LOCAL),
        fail_open=fail_open,
        share=1 / gateways,
        timeout_s=0.5,
        probe_min_s=2.2,  # the probe does not run within a test; Retry-After says when it will
        probe_max_s=30.0,
        metrics=metrics,
    )
    return RateLimiter(store, metrics, clock), remote


async def test_fail_closed_refuses_with_503_and_the_probe_delay_as_retry_after() -> None:
    clock = FakeClock()
    rl, remote = resilient(clock, fail_open=False)
    tenant = acme(rpm=60, tpm=1000)
    await rl.start()
    remote.up = False
    err = await refused(rl, tenant, request())
    assert err.status == 503 and "limit store is unreachable" in err.message
    assert dict(err.headers) == {b"retry-after": b"3"}  # the next probe in 2.2 s, rounded up
    assert rejections(rl, "store_unavailable") == 1
    with pytest.raises(StoreUnavailable):
        await rl.peek(tenant)
    await rl.close()


async def test_fail_open_admits_on_this_gateways_share_and_refuses_by_the_shares_refill() -> None:
    clock = FakeClock()
    rl, remote = resilient(clock, fail_open=True, gateways=4)
    tenant = acme(rpm=60, tpm=600)  # a quarter: 15 requests, 150 tokens, 2.5 tokens per second
    await rl.start()
    remote.up = False
    res, headers = await rl.reserve(tenant, request(40, 100))
    assert res.source == LOCAL
    assert dict(headers)[b"x-ratelimit-limit-tokens"] == b"150"
    assert dict(headers)[b"x-ratelimit-remaining-tokens"] == b"10"
    assert dict(headers)[b"x-ratelimit-reset-tokens"] == b"56s"  # 140 at 2.5/s, not at 10/s
    refunded = dict(rl.refunded_headers(res))
    assert refunded[b"x-ratelimit-remaining-tokens"] == b"150"
    assert refunded[b"x-ratelimit-reset-tokens"] == b"0s"
    err = await refused(rl, tenant, request(40, 100))  # 130 missing at the share's 2.5/s: 52 s
    assert err.status == 429 and dict(err.headers)[b"retry-after"] == b"52"
    await rl.settle(res, 1, 40)  # settled where it was taken: the local share
    assert await levels(rl, tenant) == (14.0, 110.0)
    await rl.close()


async def test_fail_open_refunded_headers_refill_at_the_shares_rate() -> None:
    clock = FakeClock()
    rl, remote = resilient(clock, fail_open=True, gateways=4)
    tenant = acme(tpm=600)  # share: 150 tokens, 2.5 per second
    await rl.start()
    remote.up = False
    await rl.reserve(tenant, request(50, 50))
    res, _ = await rl.reserve(tenant, request(20, 20))
    refunded = dict(rl.refunded_headers(res))
    assert refunded[b"x-ratelimit-remaining-tokens"] == b"50"
    assert refunded[b"x-ratelimit-reset-tokens"] == b"40s"  # 100 missing at 2.5/s (at 10/s: 10 s)
    await rl.close()


async def test_a_redis_reservation_whose_settle_finds_redis_down_is_dropped_not_moved() -> None:
    clock = FakeClock()
    rl, remote = resilient(clock, fail_open=True)
    tenant = acme(tpm=600)
    await rl.start()
    res, _ = await rl.reserve(tenant, request(40, 100))
    assert res.source == "redis"
    remote.up = False
    await rl.settle(res, 1, 40)  # dropped: the local share never lent these tokens
    assert rl._m.registry.get_sample_value("kvgate_state_settles_dropped_total") == 1
    assert await levels(rl, tenant) == (150.0,)  # the local share is untouched
    remote.up = True
    assert (await remote.peek(tenant.buckets))[0][0].level == 460.0  # Redis keeps it all charged
    await rl.close()
