"""The bucket store contract, run alike on the memory store and on Redis (a real server, with the
test's clock passed to the script so time is controlled)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import pytest

from gateway.stores.base import BucketStore
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
        store = MemoryBucketStore(clock)
    else:
        store = RedisBucketStore.from_url(redis_server.url, key_prefix="t:", timeout_s=2.0, clock=clock)
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
    assert levels is not None and levels[0].level == 880.0
    levels = await store.settle([TOK], [0], [1500], t.source)  # an overrun beyond the reservation
    assert levels is not None and levels[0].level == -620.0
    refused = await store.take([TOK], [100])
    assert not refused.allowed and refused.retry_after_s == pytest.approx(7.2)  # (100 + 620) / 100
    clock.now += 7.2
    assert (await store.take([TOK], [100])).allowed


async def test_settle_never_fills_above_capacity(store_and_clock: tuple[BucketStore, FakeClock]) -> None:
    store, _ = store_and_clock
    t = await store.take([TOK], [10])
    levels = await store.settle([TOK], [10_000], [0], t.source)
    assert levels is not None and levels[0].level == 1000.0


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
