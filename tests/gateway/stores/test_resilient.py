"""The fail-open/closed wrapper against a real redis-server that is killed, frozen and restarted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from gateway.metrics import GatewayMetrics
from gateway.stores.base import Counter, StoreUnavailable
from gateway.stores.memory import MemoryBucketStore
from gateway.stores.redis_store import RedisBucketStore
from gateway.stores.resilient import LOCAL, ResilientStore
from tests.gateway.redis_server import RedisServer, redis_server  # noqa: F401
from tests.gateway.stores.fakes import FakeClock, bucket

TOK = bucket("acme", "tokens", 1000, 10.0)
TIMEOUT_S = 0.3

Make = Callable[..., ResilientStore]


@pytest.fixture
async def make(redis_server: RedisServer) -> AsyncIterator[Make]:  # noqa: F811
    made: list[ResilientStore] = []

    def build(fail_open: bool = True, gateways: int = 4, url: str | None = None) -> ResilientStore:
        s = ResilientStore(
            RedisBucketStore.from_url(url or redis_server.url, key_prefix="kvgate:", timeout_s=TIMEOUT_S),
            MemoryBucketStore(FakeClock(), source=LOCAL),
            fail_open=fail_open,
            share=1 / gateways,
            timeout_s=TIMEOUT_S,
            probe_min_s=0.05,
            probe_max_s=0.2,
            metrics=GatewayMetrics(),
        )
        made.append(s)
        return s

    yield build
    for s in made:
        await s.close()


def errors(s: ResilientStore, op: str) -> float:
    return s._m.store_errors.labels(op)._value.get()  # type: ignore[no-any-return]


async def wait_up(s: ResilientStore, timeout: float = 10.0) -> None:
    """Poll: the probe task flips `up` on its own schedule, which is what is under test."""
    async with asyncio.timeout(timeout):
        while not s.up:  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def test_fail_open_uses_local_buckets_with_this_gateways_share(
    make: Make,
    redis_server: RedisServer,  # noqa: F811
) -> None:
    s = make(fail_open=True, gateways=4)
    await s.start()
    assert (await s.take([TOK], [100])).source == "redis"
    redis_server.stop()
    t = await s.take([TOK], [100])
    assert t.allowed and t.source == LOCAL and t.capacities == (250.0,)  # a quarter of the limit
    assert t.levels == (150.0,)
    assert not s.up and s._m.store_up._value.get() == 0
    assert errors(s, "take") == 1
    assert not (await s.take([TOK], [200])).allowed  # the share is all this gateway may use
    assert errors(s, "take") == 1  # while down, requests do not touch Redis at all


async def test_fail_closed_refuses_while_down(make: Make, redis_server: RedisServer) -> None:  # noqa: F811
    s = make(fail_open=False)
    await s.start()
    redis_server.stop()
    with pytest.raises(StoreUnavailable) as err:
        await s.take([TOK], [1])
    assert err.value.retry_after_s > 0
    with pytest.raises(StoreUnavailable):
        await s.peek([TOK])


async def test_returns_to_redis_by_itself_when_it_is_back(make: Make, redis_server: RedisServer) -> None:  # noqa: F811
    s = make(fail_open=False)
    await s.start()
    redis_server.stop()
    with pytest.raises(StoreUnavailable):
        await s.take([TOK], [1])
    await asyncio.sleep(0.5)  # a few probes fail while it is down: backoff, no crash
    redis_server.start()  # same port, empty, no script loaded
    await wait_up(s)
    t = await s.take([TOK], [1])
    assert t.allowed and t.source == "redis"


async def test_a_frozen_server_costs_one_timeout_then_nothing(
    make: Make,
    redis_server: RedisServer,  # noqa: F811
) -> None:
    s = make(fail_open=True)
    await s.start()
    redis_server.freeze()
    try:
        t0 = time.monotonic()
        t = await s.take([TOK], [1])
        first = time.monotonic() - t0
        assert t.source == LOCAL and first < TIMEOUT_S + 1.0  # bounded by the timeout, never hangs
        t0 = time.monotonic()
        await s.take([TOK], [1])
        assert time.monotonic() - t0 < TIMEOUT_S  # no second wait: the store is known down
    finally:
        redis_server.thaw()
    await wait_up(s)
    assert (await s.take([TOK], [1])).source == "redis"


async def test_settles_follow_their_reservation(make: Make, redis_server: RedisServer) -> None:  # noqa: F811
    s = make(fail_open=True, gateways=1)
    await s.start()
    remote = await s.take([TOK], [400])
    redis_server.stop()
    local = await s.take([TOK], [300])
    assert local.source == LOCAL and local.levels == (700.0,)
    # a Redis reservation settled while Redis is down is dropped and counted, never applied locally
    assert await s.settle([TOK], [400], [0], remote.source) is None
    assert s._m.settles_dropped._value.get() == 1
    (lv,), _ = await s.peek([TOK])
    assert lv.level == 700.0
    redis_server.start()
    await wait_up(s)
    # a local reservation is settled locally even after Redis is back
    levels = await s.settle([TOK], [300], [100], local.source)
    assert levels is not None and levels.levels[0].level == 900.0


async def test_start_with_redis_down_degrades_and_recovers(make: Make, redis_server: RedisServer) -> None:  # noqa: F811
    redis_server.stop()
    s = make(fail_open=True)
    await s.start()  # does not raise, does not hang
    assert not s.up
    assert (await s.take([TOK], [1])).source == LOCAL
    redis_server.start()
    await wait_up(s)
    assert (await s.take([TOK], [1])).source == "redis"


async def test_fail_open_quota_share_is_of_what_was_left_when_redis_last_answered(
    make: Make,
    redis_server: RedisServer,  # noqa: F811
) -> None:
    s = make(fail_open=True, gateways=4)
    await s.start()
    q = Counter("acme", "q:-:tokens-per-month:2026-12", 1000, time.time() + 3600, warn_level=10)
    t = await s.take([], [], [q], [600])
    assert t.source == "redis" and t.used == (600.0,)
    redis_server.stop()
    # 400 were left; this gateway's quarter of them is 100
    t = await s.take([], [], [q], [100])
    assert t.allowed and t.source == LOCAL and t.used == (100.0,) and t.crossed == ()  # no local warnings
    assert not (await s.take([], [], [q], [1])).allowed
    settled = await s.settle([], [], [], LOCAL, [q], [100], [40])
    assert settled is not None and settled.used == (40.0,)
    (used,), source = await s.peek_counters([q])
    assert used == 40.0 and source == LOCAL
    # a counter this gateway never saw: its share of the whole limit
    fresh = Counter("acme", "q:-:requests-per-day:2026-12-03", 8, time.time() + 3600)
    assert [(await s.take([], [], [fresh], [1])).allowed for _ in range(3)] == [True, True, False]
