"""The limit store contract, run alike on the memory store and on Redis (a real server, with the
test's clock passed to the script so time is controlled): token buckets, and quota counters taken
all or nothing together with them."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import pytest

from gateway.stores.base import Bucket, BucketStore, Counter
from gateway.stores.memory import MemoryBucketStore
from gateway.stores.redis_store import RedisBucketStore
from tests.gateway.redis_server import RedisServer, redis_server  # noqa: F401
from tests.gateway.stores.fakes import FakeClock, bucket

REQ = bucket("acme", "requests", 10, 1.0)  # 60 per minute, holds 10
TOK = bucket("acme", "tokens", 1000, 100.0)


@pytest.fixture(params=["memory", "redis"])
async def store_and_clock(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,  # noqa: F811
) -> AsyncIterator[tuple[BucketStore, FakeClock]]:
    clock = FakeClock()
    store: BucketStore
    if request.param == "memory":
        store = MemoryBucketStore(clock, wall_clock=clock)
    else:
        store = RedisBucketStore.from_url(
            redis_server.url, key_prefix="t:", timeout_s=2.0, clock=clock, wall_clock=clock
        )
    await store.start()
    try:
        yield store, clock
    finally:
        await store.close()


async def test_a_new_bucket_is_full_and_a_take_debits_every_bucket(
    store_and_clock: tuple[BucketStore, FakeClock],
) -> None:
    store, _ = store_and_clock
    t = await store.take([REQ, TOK], [1, 300])
    assert t.allowed and not t.too_large and t.limiting == ()
    assert t.levels == (9.0, 700.0)
    assert t.reset_s == (1.0, 3.0)
    assert t.capacities == (10, 1000)
    assert t.retry_after_s == 0.0


async def test_all_or_nothing_names_the_limiting_bucket_and_when_it_will_hold_enough(
    store_and_clock: tuple[BucketStore, FakeClock],
) -> None:
    store, clock = store_and_clock
    assert (await store.take([REQ, TOK], [1, 900])).allowed
    t = await store.take([REQ, TOK], [1, 300])
    assert not t.allowed and t.limiting == (1,)
    assert t.retry_after_s == pytest.approx(2.0)  # 200 short at 100/s
    assert t.levels == (9.0, 100.0)  # the requests bucket was not debited either
    clock.now += 2.0
    t = await store.take([REQ, TOK], [1, 300])
    assert t.allowed and t.levels == (9.0, 0.0)  # 9 + 2 s of refill is capped at 10, minus 1


async def test_a_request_larger_than_the_bucket_is_too_large_forever(
    store_and_clock: tuple[BucketStore, FakeClock],
) -> None:
    store, _ = store_and_clock
    t = await store.take([REQ, TOK], [1, 1001])
    assert not t.allowed and t.too_large and t.retry_after_s == math.inf and t.limiting == (1,)


async def test_settle_refunds_the_unused_part_and_charges_an_overrun_as_debt(
    store_and_clock: tuple[BucketStore, FakeClock],
) -> None:
    store, clock = store_and_clock
    t = await store.take([TOK], [500])
    levels = await store.settle([TOK], [500], [120], t.source)
    assert levels is not None and levels.levels[0].level == 880.0
    levels = await store.settle([TOK], [0], [1500], t.source)  # an overrun beyond the reservation
    assert levels is not None and levels.levels[0].level == -620.0
    refused = await store.take([TOK], [100])
    assert not refused.allowed and refused.retry_after_s == pytest.approx(7.2)  # (100 + 620) / 100
    clock.now += 7.2
    assert (await store.take([TOK], [100])).allowed


async def test_settle_never_fills_above_capacity(store_and_clock: tuple[BucketStore, FakeClock]) -> None:
    store, _ = store_and_clock
    t = await store.take([TOK], [10])
    levels = await store.settle([TOK], [10_000], [0], t.source)
    assert levels is not None and levels.levels[0].level == 1000.0


async def test_peek_reads_without_changing(store_and_clock: tuple[BucketStore, FakeClock]) -> None:
    store, clock = store_and_clock
    await store.take([REQ], [4])
    clock.now += 1.5
    (lv,), _ = await store.peek([REQ])
    assert lv.level == 7.5 and lv.capacity == 10 and lv.reset_s == 2.5
    (again,), _ = await store.peek([REQ])
    assert again == lv


async def test_concurrent_takes_never_overshoot(store_and_clock: tuple[BucketStore, FakeClock]) -> None:
    store, _ = store_and_clock
    results = await asyncio.gather(*(store.take([REQ, TOK], [1, 10]) for _ in range(50)))
    assert sum(r.allowed for r in results) == 10


async def test_tenants_and_kinds_are_separate_buckets(store_and_clock: tuple[BucketStore, FakeClock]) -> None:
    store, _ = store_and_clock
    other = bucket("globex", "requests", 10, 1.0)
    assert (await store.take([REQ], [10])).allowed
    assert (await store.take([other], [10])).allowed
    assert not (await store.take([REQ], [1])).allowed


def day(
    limit: float, warn_level: float | None = None, name: str = "q:-:tokens-per-day:2026-12-03"
) -> Counter:
    return Counter("acme", name, limit, expires_at=1000.0 + 86_400, warn_level=warn_level)


async def test_a_counter_and_the_buckets_take_all_or_nothing(
    store_and_clock: tuple[BucketStore, FakeClock],
) -> None:
    store, _ = store_and_clock
    q = day(500)
    t = await store.take([REQ, TOK], [1, 300], [q], [300])
    assert t.allowed and t.used == (300.0,) and t.counter_limiting == () and t.levels == (9.0, 700.0)
    # the quota refuses: nothing is taken from the buckets either, and no retry time is the store's
    t = await store.take([REQ, TOK], [1, 300], [q], [300])
    assert not t.allowed and t.counter_limiting == (0,) and t.limiting == () and t.retry_after_s == 0
    assert t.levels == (9.0, 700.0) and t.used == (300.0,)
    # a bucket refuses: nothing is added to the counter
    t = await store.take([REQ, TOK], [1, 900], [q], [100])
    assert not t.allowed and t.limiting == (1,) and t.counter_limiting == () and t.used == (300.0,)
    assert (await store.peek_counters([q]))[0] == (300.0,)
    t = await store.take([], [], [q], [200])  # exactly up to the limit passes
    assert t.allowed and t.used == (500.0,)
    assert not (await store.take([], [], [q], [1])).allowed


async def test_a_counter_settles_to_the_real_use_and_never_below_zero(
    store_and_clock: tuple[BucketStore, FakeClock],
) -> None:
    store, _ = store_and_clock
    q = day(1000)
    t = await store.take([TOK], [400], [q], [400])
    settled = await store.settle([TOK], [400], [150], t.source, [q], [400], [150])
    assert settled is not None and settled.used == (150.0,) and settled.levels[0].level == 850.0
    settled = await store.settle([], [], [], t.source, [q], [300], [0])
    assert settled is not None and settled.used == (0.0,)
    settled = await store.settle([], [], [], t.source, [q], [0], [70])  # an overrun is charged
    assert settled is not None and settled.used == (70.0,)


async def test_the_warning_is_reported_once_per_window(
    store_and_clock: tuple[BucketStore, FakeClock],
) -> None:
    store, _ = store_and_clock
    q = day(100, warn_level=80)
    assert (await store.take([], [], [q], [79])).crossed == ()
    t = await store.take([], [], [q], [1])
    assert t.crossed == (0,)
    settled = await store.settle([], [], [], t.source, [q], [1], [0])  # back under the level...
    assert settled is not None and settled.crossed == () and settled.used == (79.0,)
    assert (await store.take([], [], [q], [5])).crossed == ()  # ...and over again: not twice
    other = day(100, warn_level=80, name="q:-:tokens-per-day:2026-12-04")  # the next window warns anew
    assert (await store.settle([], [], [], t.source, [other], [0], [90])) is not None  # missing: nothing
    assert (await store.take([], [], [other], [90])).crossed == (0,)


async def test_a_counter_past_its_lifetime_is_gone_and_takes_nothing_in_settle(
    store_and_clock: tuple[BucketStore, FakeClock],
) -> None:
    store, clock = store_and_clock
    q = Counter("acme", "q:-:requests-per-day:2026-12-03", 2, expires_at=clock.now + 10)
    t = await store.take([], [], [q], [2])
    assert t.allowed and t.used == (2.0,)
    assert not (await store.take([], [], [q], [1])).allowed
    clock.now += 10  # the window's end plus grace has passed
    settled = await store.settle([], [], [], t.source, [q], [1], [0])
    assert settled is not None and settled.used == (0.0,)
    assert (await store.peek_counters([q]))[0] == (0.0,)


async def test_concurrent_takes_never_overshoot_a_counter(
    store_and_clock: tuple[BucketStore, FakeClock],
) -> None:
    store, _ = store_and_clock
    q = day(95)
    results = await asyncio.gather(*(store.take([REQ], [0], [q], [10]) for _ in range(50)))
    assert sum(r.allowed for r in results) == 9
    assert (await store.peek_counters([q]))[0] == (90.0,)


async def test_tenant_and_key_buckets_are_separate(store_and_clock: tuple[BucketStore, FakeClock]) -> None:
    store, _ = store_and_clock
    key_req = Bucket("acme", "requests", REQ.spec, key="ci-bot")
    assert (await store.take([REQ, key_req], [1, 10])).allowed
    t = await store.take([REQ, key_req], [1, 1])
    assert not t.allowed and t.limiting == (1,) and t.levels == (9.0, 0.0)
