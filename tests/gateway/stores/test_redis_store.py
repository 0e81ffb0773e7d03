"""The Redis store against a real private redis-server: the Lua script computes exactly what
policies/token_bucket.py and policies/quota.py compute (bit for bit, on tables of cases and on random
ones, buckets and counters in one take), keys carry TTLs, the server's TIME is the buckets' clock,
and a flushed script cache is reloaded."""

from __future__ import annotations

import math
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from gateway.stores.base import Bucket, Counter
from gateway.stores.redis_store import RedisBucketStore
from policies import quota
from policies.quota import EMPTY, CounterState
from policies.token_bucket import BucketSpec, BucketState, refill, settle, take_all
from tests.gateway.redis_server import RedisServer, redis_server  # noqa: F401
from tests.gateway.stores.fakes import bucket


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisBucketStore]:  # noqa: F811
    s = RedisBucketStore.from_url(redis_server.url, key_prefix="kvgate:", timeout_s=2.0)
    await s.start()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def raw(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:  # noqa: F811
    r = aioredis.Redis.from_url(redis_server.url)
    try:
        yield r
    finally:
        await r.aclose()


@dataclass(frozen=True)
class Case:
    spec: BucketSpec
    state: BucketState | None  # None: no key (a full bucket)
    a: float  # take: amount; settle: reserved
    b: float = 0.0  # settle: actual


NOW = 1_700_000_123.456789
ODD = BucketSpec.per_minute(7, burst=13)  # refill 7/60, not a dyadic fraction
CASES = [
    Case(BucketSpec(10, 1), None, 3),  # missing key = full
    Case(BucketSpec(10, 1), BucketState(2, NOW - 3.5), 5),  # refilled to 5.5, then exactly enough
    Case(BucketSpec(10, 1), BucketState(2, NOW - 3.5), 5.6),  # 0.1 short
    Case(BucketSpec(10, 1), BucketState(4, NOW + 50), 4),  # the clock went back: nothing added
    Case(BucketSpec(10, 1), BucketState(12, NOW), 1),  # capacity lowered under a full bucket
    Case(BucketSpec(10, 1), BucketState(-30, NOW - 1), 1),  # debt
    Case(BucketSpec(10, 1), None, 11),  # larger than the bucket can ever hold
    Case(BucketSpec(10, 1), BucketState(0, NOW), 0),  # zero amount always passes
    Case(ODD, BucketState(0.1, NOW - 0.123456), 0.1, 0.05),
    Case(ODD, BucketState(-1e-9, NOW - 1e-6), 1, 3),
    Case(BucketSpec.per_minute(200_000), BucketState(12_345.678, NOW - 0.017), 4_096, 17),
    Case(BucketSpec(1e12, 3.3e7), BucketState(5e11, NOW - 1234.5), 6.0e11, 1),
]


def key(store: RedisBucketStore, b: Bucket) -> str:
    return store.key(b)


async def put(raw: aioredis.Redis, k: str, state: BucketState | None) -> None:
    await raw.delete(k)
    if state is not None:
        await raw.hset(k, mapping={"l": repr(float(state.level)), "t": repr(float(state.updated_at))})


async def stored(raw: aioredis.Redis, k: str) -> BucketState:
    h = await raw.hgetall(k)
    return BucketState(float(h[b"l"]), float(h[b"t"]))


def as_bucket(i: int, spec: BucketSpec) -> Bucket:
    return Bucket(f"t{i}", "tokens", spec)


async def check_take(store: RedisBucketStore, raw: aioredis.Redis, cases: list[Case], now: float) -> None:
    buckets = [as_bucket(i, c.spec) for i, c in enumerate(cases)]
    for b, c in zip(buckets, cases, strict=True):
        await put(raw, key(store, b), c.state)
    expected = take_all([(c.spec, c.state or BucketState.full(c.spec, now), c.a) for c in cases], now)
    reply = await store.run("take", buckets, [c.a for c in cases], None, now=now)
    assert (reply[0] == b"1") == expected.allowed
    assert (reply[1] == b"1") == expected.too_large
    assert float(reply[2]) == expected.retry_after_s
    for i, (b, s) in enumerate(zip(buckets, expected.states, strict=True)):
        assert float(reply[3 + 3 * i]) == s.level, (cases[i], i)
        assert max(0.0, float(reply[3 + 3 * i])) == expected.remaining[i]
        assert float(reply[4 + 3 * i]) == expected.reset_s[i]
        assert (float(reply[5 + 3 * i]) > 0) == (i in expected.limiting)
        assert await stored(raw, key(store, b)) == s


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
async def test_lua_take_equals_python_take(store: RedisBucketStore, raw: aioredis.Redis, case: Case) -> None:
    await check_take(store, raw, [case], NOW)


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
async def test_lua_settle_and_peek_equal_python(
    store: RedisBucketStore, raw: aioredis.Redis, case: Case
) -> None:
    b = as_bucket(0, case.spec)
    k = key(store, b)
    start = case.state or BucketState.full(case.spec, NOW)
    await put(raw, k, case.state)
    peeked = refill(case.spec, start, NOW + 0.25)
    reply = await store.run("peek", [b], None, None, now=NOW + 0.25)
    assert float(reply[3]) == peeked.level
    if case.state is None:
        assert await raw.exists(k) == 0  # peek writes nothing
    else:
        assert await stored(raw, k) == case.state
    expected = settle(case.spec, start, case.a, case.b, NOW + 0.5)
    reply = await store.run("settle", [b], [case.a], [case.b], now=NOW + 0.5)
    assert float(reply[3]) == expected.level
    assert await stored(raw, k) == expected


async def test_lua_take_all_two_buckets_equals_python(store: RedisBucketStore, raw: aioredis.Redis) -> None:
    for pair in ([CASES[1], CASES[2]], [CASES[0], CASES[6]], [CASES[5], CASES[8]], [CASES[9], CASES[10]]):
        await check_take(store, raw, pair, NOW)


async def test_lua_equals_python_on_random_cases(store: RedisBucketStore, raw: aioredis.Redis) -> None:
    rng = random.Random(4)
    for _ in range(150):
        spec = BucketSpec(
            rng.choice([1, 60, 600, 10_000, 2e6]) * rng.uniform(0.5, 2), rng.uniform(0.001, 5000)
        )
        state = (
            None
            if rng.random() < 0.15
            else BucketState(rng.uniform(-spec.capacity, spec.capacity * 1.1), NOW + rng.uniform(-3600, 5))
        )
        amount = rng.choice([0.0, 1.0, rng.uniform(0, spec.capacity * 1.2)])
        await check_take(store, raw, [Case(spec, state, amount)], NOW)


async def test_keys_are_prefixed_hash_tagged_and_expire_when_full_again(
    store: RedisBucketStore, raw: aioredis.Redis
) -> None:
    b = bucket("acme", "tokens", 600, 10.0)
    assert store.key(b) == "kvgate:{acme}:tokens"
    t = await store.take([b], [250])  # 25 s until full again
    assert t.allowed
    ttl_ms = await raw.pttl("kvgate:{acme}:tokens")
    assert 25_000 < ttl_ms <= 26_000
    small = bucket("acme", "requests", 10, 100.0)
    await store.take([small], [1])  # full again in 10 ms: the key lives ~1 s
    assert 0 < await raw.pttl("kvgate:{acme}:requests") <= 1_010
    await store.settle([b], [250], [0], "redis")  # back to full: the key just outlives that
    assert await raw.pttl("kvgate:{acme}:tokens") <= 1_000


async def test_server_time_is_the_shared_clock(redis_server: RedisServer, raw: aioredis.Redis) -> None:  # noqa: F811
    a = RedisBucketStore.from_url(redis_server.url, key_prefix="kvgate:", timeout_s=2.0)
    b = RedisBucketStore.from_url(redis_server.url, key_prefix="kvgate:", timeout_s=2.0)
    try:
        spec = bucket("acme", "tokens", 1000, 1.0)
        assert (await a.take([spec], [600])).allowed
        refused = await b.take([spec], [600])  # the other gateway sees the same bucket
        assert not refused.allowed and 199 < refused.retry_after_s <= 200
        server_now = float((await raw.time())[0])
        assert abs((await stored(raw, a.key(spec))).updated_at - server_now) < 5
    finally:
        await a.close()
        await b.close()


async def test_script_is_reloaded_after_the_server_lost_it(
    store: RedisBucketStore, raw: aioredis.Redis
) -> None:
    b = bucket("acme", "requests", 10, 1.0)
    assert (await store.take([b], [1])).allowed
    await raw.script_flush()
    t = await store.take([b], [1])
    assert t.allowed and math.isclose(t.levels[0], 8, abs_tol=0.1)


# -- quota counters: quota.lua + limits.lua against policies/quota.py ---------------------------------


@dataclass(frozen=True)
class QCase:
    limit: float
    state: CounterState | None  # None: no key (an empty counter)
    a: float  # take: amount; settle: reserved
    b: float = 0.0  # settle: actual
    warn: float | None = None


QCASES = [
    QCase(100, None, 100),  # exactly the limit, from an empty counter
    QCase(100, None, 101),  # larger than the quota
    QCase(100, CounterState(60), 41),  # would exceed
    QCase(100, CounterState(60), 20, 0, 80),  # reaches the warn level: crossed
    QCase(100, CounterState(85, True), 5, 0, 80),  # already warned this window
    QCase(100, CounterState(130), 0),  # over after an overrun: even 0 is refused
    QCase(2_000_000, CounterState(1_999_999), 1, 0, 1_600_000),
    QCase(5e14, CounterState(123_456_789_012), 4096, 17, 4e14),
    QCase(10, CounterState(3, True), 0, 9),  # settle: an overrun past the limit
    QCase(10, CounterState(3), 8, 0),  # settle: never below zero
]


def as_counter(i: int, c: QCase, expires_at: float) -> Counter:
    return Counter(f"t{i}", f"q:-:tokens-per-day:{i}", c.limit, expires_at, c.warn)


async def put_counter(raw: aioredis.Redis, k: str, state: CounterState | None) -> None:
    await raw.delete(k)
    if state is not None:
        await raw.hset(k, mapping={"u": repr(float(state.used)), "w": "1" if state.warned else "0"})


async def stored_counter(raw: aioredis.Redis, k: str) -> CounterState | None:
    h = await raw.hgetall(k)
    return CounterState(float(h[b"u"]), h[b"w"] == b"1") if h else None


async def check_counters(
    store: RedisBucketStore, raw: aioredis.Redis, buckets: list[Case], counters: list[QCase]
) -> None:
    """One take over buckets and counters, in Lua and in Python: same verdict, levels and states."""
    bs = [as_bucket(i, c.spec) for i, c in enumerate(buckets)]
    cs = [as_counter(i, c, time.time() + 3600) for i, c in enumerate(counters)]
    for b, c in zip(bs, buckets, strict=True):
        await put(raw, key(store, b), c.state)
    for q, c in zip(cs, counters, strict=True):
        await put_counter(raw, key(store, q), c.state)
    cstates = [c.state or EMPTY for c in counters]
    refusing = quota.refusing([(c.limit, s, c.a) for c, s in zip(counters, cstates, strict=True)])
    expected = take_all(
        [(c.spec, c.state or BucketState.full(c.spec, NOW), c.a) for c in buckets], NOW, not refusing
    )
    t = await store.run(
        "take", bs, [c.a for c in buckets], None, now=NOW, counters=cs, ca=[c.a for c in counters]
    )
    assert (t[0] == b"1") == expected.allowed
    for b, s in zip(bs, expected.states, strict=True):
        assert await stored(raw, key(store, b)) == s
    at = 3 + 3 * len(buckets)
    for k, (q, c) in enumerate(zip(cs, counters, strict=True)):
        state, crossed = cstates[k], False
        if expected.allowed:
            state, crossed = quota.debit(state, c.a, c.warn)
        assert float(t[at].split()[k]) == state.used
        assert (t[at + 1][k : k + 1] == b"r") == (k in refusing)
        assert (t[at + 1][k : k + 1] == b"w") == crossed
        written = await stored_counter(raw, key(store, q))
        assert written == (state if expected.allowed else c.state), (c, written)


@pytest.mark.parametrize("case", QCASES, ids=range(len(QCASES)))
async def test_lua_counter_take_equals_python(
    store: RedisBucketStore, raw: aioredis.Redis, case: QCase
) -> None:
    await check_counters(store, raw, [], [case])
    await check_counters(store, raw, [CASES[1]], [case])  # with a bucket that passes
    await check_counters(store, raw, [CASES[2]], [case])  # with a bucket that refuses


@pytest.mark.parametrize("case", QCASES, ids=range(len(QCASES)))
async def test_lua_counter_settle_and_peek_equal_python(
    store: RedisBucketStore, raw: aioredis.Redis, case: QCase
) -> None:
    q = as_counter(0, case, time.time() + 3600)
    k = key(store, q)
    await put_counter(raw, k, case.state)
    reply = await store.run("peek", [], None, None, counters=[q])
    assert float(reply[3]) == (case.state or EMPTY).used and reply[4] == b"-"
    assert await stored_counter(raw, k) == case.state  # peek writes nothing
    expected, crossed = quota.settle(case.state, case.a, case.b, case.warn)
    reply = await store.run("settle", [], None, None, counters=[q], ca=[case.a], cb=[case.b])
    assert float(reply[3]) == (expected.used if expected is not None else 0.0)
    assert (reply[4] == b"w") == crossed
    assert await stored_counter(raw, k) == expected


async def test_lua_counters_equal_python_on_random_cases(
    store: RedisBucketStore, raw: aioredis.Redis
) -> None:
    rng = random.Random(15)
    for _ in range(120):
        counters = []
        for _ in range(rng.randint(1, 3)):
            limit = float(rng.choice([1, 100, 10_000, 50_000_000]))
            state = (
                None
                if rng.random() < 0.2
                else CounterState(float(rng.randint(0, int(limit * 1.1))), rng.random() < 0.2)
            )
            warn = None if rng.random() < 0.4 else float(int(limit * rng.uniform(0.5, 0.95)))
            counters.append(QCase(limit, state, float(rng.randint(0, int(limit * 0.6) + 1)), 0.0, warn))
        buckets = [rng.choice(CASES)] if rng.random() < 0.5 else []
        await check_counters(store, raw, buckets, counters)


async def test_counter_keys_are_hash_tagged_and_live_until_their_expiry(
    store: RedisBucketStore, raw: aioredis.Redis
) -> None:
    q = Counter("acme", "q:ci-bot:tokens-per-day:2026-12-03", 100, time.time() + 90)
    key_bucket = Bucket("acme", "requests", BucketSpec(10, 1), key="ci-bot")
    assert store.key(q) == "kvgate:{acme}:q:ci-bot:tokens-per-day:2026-12-03"
    assert store.key(key_bucket) == "kvgate:{acme}:k:ci-bot:requests"
    assert (await store.take([key_bucket], [1], [q], [5])).allowed
    assert 88_000 < await raw.pttl(store.key(q)) <= 90_000
    gone = Counter("acme", "q:-:tokens-per-day:2026-12-02", 100, time.time() - 1)
    await put_counter(raw, store.key(gone), CounterState(50))
    settled = await store.settle([], [], [], "redis", [gone], [10], [0])  # its lifetime is over
    assert settled is not None and settled.used == (0.0,)
    assert await stored_counter(raw, store.key(gone)) == CounterState(50)  # not written again
