"""gateway/ledger.py and the ledger stores: batching off the request path, a failed flush retried
with the same batch id (applied once in Redis however often it is sent), shutdown flushes, retention."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.config import LedgerConfig
from gateway.ledger import UsageLedger
from gateway.metrics import GatewayMetrics
from gateway.stores.ledger_store import MemoryLedgerStore, RedisLedgerStore, Rows
from policies.charging import Charge
from tests.gateway.redis_server import RedisServer, redis_server  # noqa: F401
from tests.gateway.stores.fakes import FakeClock

T0 = 1_796_342_400.0  # 2026-12-03T00:00:00Z


class FlakyStore(MemoryLedgerStore):
    """A memory ledger that fails its next `failures` adds, after applying them when `apply_then_fail`
    (as a store whose answer was lost), and remembers every batch id it was sent."""

    def __init__(self, failures: int = 0, apply_then_fail: bool = False) -> None:
        super().__init__(400, FakeClock(T0))
        self.failures = failures
        self.apply_then_fail = apply_then_fail
        self.sent: list[str] = []
        self.applied: set[str] = set()

    async def add(self, batch_id: str, rows: Rows) -> None:
        self.sent.append(batch_id)
        if self.failures and not self.apply_then_fail:
            self.failures -= 1
            raise ConnectionError("down")
        if batch_id not in self.applied:  # what the Redis store's marker does
            self.applied.add(batch_id)
            await super().add(batch_id, rows)
        if self.failures:
            self.failures -= 1
            raise TimeoutError("answer lost")


def ledger(store: MemoryLedgerStore, clock: FakeClock, **cfg: object) -> UsageLedger:
    return UsageLedger(store, LedgerConfig.model_validate(cfg), GatewayMetrics(), "gw1", clock)


async def test_records_aggregate_by_tenant_key_model_and_hour_and_flush_in_one_call() -> None:
    clock = FakeClock(T0 + 10)
    store = FlakyStore()
    led = ledger(store, clock)
    led.record("acme", "ci-bot", "m", Charge(1, 50, 40, 10, 8))
    led.record("acme", "ci-bot", "m", Charge(1, 30, 20, 10, 0, True))
    led.record("acme", "-", "m", Charge(1, 5, 5, 0))
    led.record("acme", "ci-bot", "m", Charge(0, 0))  # nothing used, nothing recorded
    clock.now = T0 + 3600  # the next hour
    led.record("acme", "ci-bot", "m", Charge(1, 7, 4, 3))
    assert led.pending_records == 4 and store.sent == []  # recording does no I/O
    assert await led.flush() and store.sent == ["gw1:1"]
    assert sorted(await store.read("acme", int(T0), int(T0) + 7200)) == [
        (int(T0), "-", "m", (1, 5, 0, 0, 0)),
        (int(T0), "ci-bot", "m", (2, 60, 8, 20, 1)),
        (int(T0) + 3600, "ci-bot", "m", (1, 4, 0, 3, 0)),
    ]
    assert led.pending_records == 0 and await led.flush() and store.sent == ["gw1:1"]  # nothing to send


async def test_a_failed_flush_keeps_its_batch_and_retries_it_with_the_same_id() -> None:
    clock = FakeClock(T0)
    store = FlakyStore(failures=2, apply_then_fail=True)  # applied, but the answer was lost, twice
    led = ledger(store, clock)
    led.record("acme", "-", "m", Charge(1, 10, 10, 0))
    assert not await led.flush()
    led.record("acme", "-", "m", Charge(1, 1, 1, 0))  # arrives while the first batch is in doubt
    assert led.pending_records == 2
    assert not await led.flush()
    assert await led.flush()
    assert store.sent == ["gw1:1", "gw1:1", "gw1:1", "gw1:2"]  # the batch in doubt first, as it was
    assert await store.read("acme", int(T0), int(T0) + 3600) == [(int(T0), "-", "m", (2, 11, 0, 0, 0))]
    assert led._m.ledger_flush_errors._value.get() == 2


async def test_flush_max_records_wakes_the_writer_and_stop_flushes_the_rest() -> None:
    clock = FakeClock(T0)
    store = FlakyStore()
    led = ledger(store, clock, flush_interval_s=60, flush_max_records=3)
    await led.start()
    for _ in range(3):
        led.record("acme", "-", "m", Charge(1, 1, 1, 0))
    async with asyncio.timeout(5):
        while not store.sent:  # noqa: ASYNC110  (the writer task runs on its own)
            await asyncio.sleep(0.01)
    led.record("acme", "-", "m", Charge(1, 1, 1, 0))
    await led.stop()  # a clean shutdown writes what is left
    assert led.pending_records == 0 and len(store.sent) == 2
    assert (await store.read("acme", int(T0), int(T0) + 3600))[0][3][0] == 4


async def test_memory_ledger_drops_hours_past_retention() -> None:
    clock = FakeClock(T0)
    store = MemoryLedgerStore(retention_days=1, wall_clock=clock)
    await store.add("a", {("acme", int(T0) - 3 * 86_400): {("-", "m"): [1, 1, 0, 0, 0]}})
    await store.add("b", {("acme", int(T0)): {("-", "m"): [1, 1, 0, 0, 0]}})
    assert [r[0] for r in await store.read("acme", 0, int(T0) + 3600)] == [int(T0)]


@pytest.fixture
async def redis_ledger(redis_server: RedisServer) -> AsyncIterator[tuple[RedisLedgerStore, aioredis.Redis]]:  # noqa: F811
    store = RedisLedgerStore.from_url(
        redis_server.url, key_prefix="kvgate:", retention_days=30, timeout_s=2.0
    )
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        yield store, raw
    finally:
        await store.close()
        await raw.aclose()


async def test_redis_ledger_applies_a_batch_once_however_often_it_is_sent(
    redis_ledger: tuple[RedisLedgerStore, aioredis.Redis],
) -> None:
    store, raw = redis_ledger
    hour = int(time.time()) // 3600 * 3600  # Redis expires keys by its own clock: use real hours
    rows: Rows = {
        ("acme", hour): {("ci-bot", "llama:sql-adapter"): [2, 60, 8, 20, 1], ("-", "m"): [1, 5, 0, 0, 0]},
        ("globex", hour + 3600): {("-", "m"): [1, 7, 0, 3, 0]},
    }
    for _ in range(3):
        await store.add("gw1:1", rows)
    await store.add("gw2:1", {("acme", hour): {("-", "m"): [1, 1, 0, 0, 0]}})
    assert sorted(await store.read("acme", hour, hour + 7200)) == [
        (hour, "-", "m", (2, 6, 0, 0, 0)),
        (hour, "ci-bot", "llama:sql-adapter", (2, 60, 8, 20, 1)),  # a model name may hold colons
    ]
    assert await store.read("globex", hour + 3600, hour + 7200) == [(hour + 3600, "-", "m", (1, 7, 0, 3, 0))]
    assert await store.read("globex", hour, hour + 3600) == []  # the hours asked only
    # each hour's hash expires retention_days after the hour ends; its key carries the tenant's hash tag
    expires_at = await raw.expiretime(store.hour_key("acme", hour))
    assert (
        expires_at == hour + 3600 + 30 * 86_400
        and store.hour_key("acme", hour) == f"kvgate:{{acme}}:usage:{hour}"
    )
