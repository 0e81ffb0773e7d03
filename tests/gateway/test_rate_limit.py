"""gateway/rate_limit.py driven directly: reserve, refuse, settle and refund on the memory store with an
injected clock, and the two failure modes of the resilient store around a Redis that does not answer
(a hand-written fake: no server is needed to be unreachable)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from gateway.config import TenantConfig, TenantLimits
from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.rate_limit import RateLimiter
from gateway.stores.base import (
    NO_AMOUNTS,
    NO_COUNTERS,
    Bucket,
    Counter,
    Level,
    Settled,
    Take,
)
from gateway.stores.memory import MemoryBucketStore
from gateway.tenants import Tenant, compile_tenant
from policies.types import RequestInfo
from tests.gateway.stores.fakes import FakeClock


def acme(**limits: Any) -> Tenant:
    return compile_tenant(TenantConfig(name="acme", limits=TenantLimits(**limits)))


def request(prompt: int = 40, max_tokens: int = 100) -> RequestInfo:
    return RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=prompt, max_tokens=max_tokens)


def limiter(clock: FakeClock | None = None) -> RateLimiter:
    clock = clock or FakeClock()
    return RateLimiter(MemoryBucketStore(clock), GatewayMetrics(), clock)


def rejections(rl: RateLimiter, reason: str) -> float:
    value = rl._m.registry.get_sample_value("kvgate_rejections_total", {"tenant": "acme", "reason": reason})
    return value or 0.0


async def levels(rl: RateLimiter, tenant: Tenant) -> tuple[float, ...]:
    lv, _ = await rl.peek(tenant)
    return tuple(x.level for x in lv)


async def refused(rl: RateLimiter, tenant: Tenant, info: RequestInfo) -> GatewayError:
    with pytest.raises(GatewayError) as err:
        await rl.reserve(tenant, info)
    return err.value


# --- reserve and its headers -----------------------------------------------------------------------


async def test_reserve_takes_one_request_and_the_tokens_and_says_so_in_openai_headers() -> None:
    rl = limiter()
    tenant = acme(rpm=60, tpm=1000)  # refills 1 request and 16.67 tokens per second
    res, headers = await rl.reserve(tenant, request(40, 100))
    assert res.amounts == (1.0, 140.0) and res.source == "memory"
    assert headers == [
        (b"x-ratelimit-limit-requests", b"60"),
        (b"x-ratelimit-remaining-requests", b"59"),
        (b"x-ratelimit-reset-requests", b"1s"),
        (b"x-ratelimit-limit-tokens", b"1000"),
        (b"x-ratelimit-remaining-tokens", b"860"),
        (b"x-ratelimit-reset-tokens", b"8.4s"),  # 140 tokens at 1000/60 per second
    ]
    assert await levels(rl, tenant) == (59.0, 860.0)


async def test_headers_limit_is_the_burst_capacity_and_a_tenant_may_have_one_limit_only() -> None:
    rl = limiter()
    tokens_only = acme(tpm=600, tpm_burst=300)
    _, headers = await rl.reserve(tokens_only, request(50, 50))
    assert headers == [
        (b"x-ratelimit-limit-tokens", b"300"),
        (b"x-ratelimit-remaining-tokens", b"200"),
        (b"x-ratelimit-reset-tokens", b"10s"),  # 100 tokens at 10 per second
    ]


# --- refusals: 429 with a Retry-After from the refill, 400 when waiting never helps -----------------


@pytest.mark.parametrize(
    ("limits", "first", "elapsed_s", "second", "retry_after", "reason", "names"),
    [
        # requests: 6 per minute held 1 at a time; one refill takes 10 s, 3.5 s of it have passed
        ({"rpm": 6, "rpm_burst": 1}, request(), 3.5, request(), 7, "rate_limit_requests", ["RPM"]),
        ({"rpm": 6, "rpm_burst": 1}, request(), 0.0, request(), 10, "rate_limit_requests", ["RPM"]),
        # tokens: 600 per minute = 10/s; 100 left, 500 needed: 40 s, of which 12.3 s have passed
        ({"tpm": 600}, request(400, 100), 12.3, request(400, 100), 28, "rate_limit_tokens", ["TPM"]),
        # both: the later of the two is when both hold enough at once; the reason says tokens
        (
            {"rpm": 6, "rpm_burst": 1, "tpm": 600},
            request(400, 100),
            0.0,
            request(400, 100),
            40,
            "rate_limit_tokens",
            ["RPM", "TPM"],
        ),
    ],
)
async def test_429_retry_after_is_computed_from_the_refill(
    limits: dict[str, int],
    first: RequestInfo,
    elapsed_s: float,
    second: RequestInfo,
    retry_after: int,
    reason: str,
    names: list[str],
) -> None:
    clock = FakeClock()
    rl = limiter(clock)
    tenant = acme(**limits)
    await rl.reserve(tenant, first)
    clock.now += elapsed_s
    before = await levels(rl, tenant)
    err = await refused(rl, tenant, second)
    headers = dict(err.headers)
    assert err.status == 429 and err.code == "rate_limit_exceeded"
    assert headers[b"retry-after"] == str(retry_after).encode()
    assert f"try again in {retry_after}s" in err.message
    assert [n for n in ("RPM", "TPM") if f"({n})" in err.message] == names
    assert rejections(rl, reason) == 1
    assert await levels(rl, tenant) == before  # a refused request takes nothing from any bucket


async def test_waiting_the_advertised_retry_after_is_enough() -> None:
    clock = FakeClock()
    rl = limiter(clock)
    tenant = acme(rpm=60, tpm=600)
    await rl.reserve(tenant, request(333, 200))
    err = await refused(rl, tenant, request(333, 200))  # 67 left, 533 needed at 10/s: 46.6 s
    retry = int(dict(err.headers)[b"retry-after"])
    assert retry == 47
    clock.now += retry - 1
    await refused(rl, tenant, request(333, 200))  # a second earlier is not
    clock.now += 1
    await rl.reserve(tenant, request(333, 200))


async def test_429_headers_show_the_buckets_as_they_stand_without_this_request() -> None:
    rl = limiter()
    tenant = acme(rpm=60, tpm=600)
    await rl.reserve(tenant, request(400, 100))
    err = await refused(rl, tenant, request(400, 100))
    headers = dict(err.headers)
    assert headers[b"x-ratelimit-remaining-tokens"] == b"100"
    assert headers[b"x-ratelimit-remaining-requests"] == b"59"
    assert headers[b"x-ratelimit-reset-tokens"] == b"50s"
    assert "remaining 100, requested 500" in err.message


@pytest.mark.parametrize(
    ("limits", "info", "text"),
    [
        ({"tpm": 1000}, request(900, 200), "limit 1000 per minute, requested 1100 (900 prompt + 200 max"),
        # the burst is what the bucket holds: a request above it can never pass, whatever the tpm
        ({"tpm": 1000, "tpm_burst": 500}, request(400, 200), "limit 1000 per minute (bucket holds 500)"),
    ],
)
async def test_a_reservation_larger_than_the_bucket_is_400_without_retry_after(
    limits: dict[str, int], info: RequestInfo, text: str
) -> None:
    rl = limiter()
    tenant = acme(rpm=60, **limits)
    err = await refused(rl, tenant, info)
    assert err.status == 400 and err.code == "request_too_large" and err.param == "max_tokens"
    assert text in err.message and "(TPM)" in err.message
    headers = dict(err.headers)
    assert b"retry-after" not in headers  # waiting never helps: no Retry-After for a client to obey
    assert headers[b"x-ratelimit-limit-tokens"] == str(limits.get("tpm_burst", 1000)).encode()
    assert rejections(rl, "too_large") == 1 and rejections(rl, "rate_limit_tokens") == 0
    assert await levels(rl, tenant) == (60.0, limits.get("tpm_burst", 1000))  # nothing taken


async def test_too_large_wins_over_an_empty_bucket() -> None:
    rl = limiter()
    tenant = acme(rpm=6, rpm_burst=1, tpm=1000)
    await rl.reserve(tenant, request(10, 10))  # the requests bucket is now empty
    err = await refused(rl, tenant, request(900, 200))
    assert err.status == 400 and err.code == "request_too_large"


# --- settle, refunds ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requests", "tokens", "expected"),
    [
        (1, 47, (59.0, 1000.0 - 47)),  # used less than reserved: the difference comes back
        (1, 140, (59.0, 860.0)),  # used exactly the reservation
        (1, 300, (59.0, 700.0)),  # overshoot: charged on top of the reservation
        (0, 0, (60.0, 1000.0)),  # never ran: everything back
    ],
)
async def test_settle_reconciles_the_reservation_with_real_usage(
    requests: int, tokens: int, expected: tuple[float, float]
) -> None:
    rl = limiter()
    tenant = acme(rpm=60, tpm=1000)
    res, _ = await rl.reserve(tenant, request(40, 100))
    await rl.settle(res, requests, tokens)
    assert await levels(rl, tenant) == expected


async def test_an_overshoot_can_leave_debt_that_the_refill_repays_before_the_next_request() -> None:
    clock = FakeClock()
    rl = limiter(clock)
    tenant = acme(tpm=600)
    res, _ = await rl.reserve(tenant, request(400, 100))
    await rl.settle(res, 1, 1100)  # e.g. the replica ignored the cap: 1100 used of 500 reserved
    assert await levels(rl, tenant) == (-500.0,)
    err = await refused(rl, tenant, request(5, 5))  # 10 needed from -500, at 10/s: 51 s
    assert dict(err.headers)[b"retry-after"] == b"51"
    assert dict(err.headers)[b"x-ratelimit-remaining-tokens"] == b"0"  # never negative in a header
    clock.now += 51
    await rl.reserve(tenant, request(5, 5))


class CountingStore:
    """The memory store behind a door: `take` waits for `gate` (so it yields, as Redis does) and
    every call is counted."""

    def __init__(self, clock: FakeClock) -> None:
        self.mem = MemoryBucketStore(clock)
        self.gate = asyncio.Event()
        self.gate.set()
        self.takes = 0
        self.settles = 0

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def take(
        self,
        buckets: Sequence[Bucket],
        amounts: Sequence[float],
        counters: Sequence[Counter] = NO_COUNTERS,
        counter_amounts: Sequence[float] = NO_AMOUNTS,
    ) -> Take:
        await self.gate.wait()
        self.takes += 1
        return self.mem.take_now(buckets, amounts, counters, counter_amounts)

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
        self.settles += 1
        return self.mem.settle_now(buckets, reserved, actual, counters, counter_reserved, counter_actual)

    async def peek(self, buckets: Sequence[Bucket]) -> tuple[tuple[Level, ...], str]:
        return self.mem.peek_now(buckets), self.mem.source

    async def peek_counters(self, counters: Sequence[Counter]) -> tuple[tuple[float, ...], str]:
        return await self.mem.peek_counters(counters)


async def test_settle_with_nothing_to_reconcile_makes_no_store_call() -> None:
    clock = FakeClock()
    store = CountingStore(clock)
    rl = RateLimiter(store, GatewayMetrics(), clock)
    tenant = acme(rpm=60, tpm=1000)
    res, _ = await rl.reserve(tenant, request(40, 100))
    await rl.settle(res, 1, 140)
    assert store.settles == 0
    await rl.settle(res, 1, 139)
    assert store.settles == 1


async def test_a_reserve_cancelled_while_the_store_answers_gives_back_what_it_took() -> None:
    clock = FakeClock()
    store = CountingStore(clock)
    rl = RateLimiter(store, GatewayMetrics(), clock)
    tenant = acme(rpm=60, tpm=1000)
    store.gate.clear()
    task = asyncio.ensure_future(rl.reserve(tenant, request(40, 100)))
    await asyncio.sleep(0)
    task.cancel()  # the client left while the take was on its way
    await asyncio.sleep(0)
    store.gate.set()  # ... and the store took it all the same
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(5):  # the take completes, then its give-back is spawned
        await asyncio.sleep(0)
    await rl.close()  # waits for the background give-back
    assert store.takes == 1 and store.settles == 1
    assert await levels(rl, tenant) == (60.0, 1000.0)


async def test_refund_later_gives_everything_back_in_the_background() -> None:
    rl = limiter()
    tenant = acme(rpm=60, tpm=1000)
    res, _ = await rl.reserve(tenant, request(40, 100))
    rl.refund_later(res)
    await rl.close()  # close waits for tracked background work
    assert await levels(rl, tenant) == (60.0, 1000.0)


@pytest.mark.parametrize(
    ("earlier_tokens", "expected"),
    [
        # alone in full buckets: as if it never came
        (None, {"remaining-requests": b"60", "remaining-tokens": b"1000", "reset-tokens": b"0s"}),
        # after another request of 500 tokens: its 500 are still out, 30 s of refill at 1000/60 per s
        (500, {"remaining-requests": b"59", "remaining-tokens": b"500", "reset-tokens": b"30s"}),
    ],
)
async def test_refunded_headers_describe_the_buckets_once_the_reservation_is_back(
    earlier_tokens: int | None, expected: dict[str, bytes]
) -> None:
    rl = limiter()
    tenant = acme(rpm=60, tpm=1000)
    if earlier_tokens is not None:
        await rl.reserve(tenant, request(earlier_tokens, 0))
    res, _ = await rl.reserve(tenant, request(40, 100))
    headers = {k.decode().removeprefix("x-ratelimit-"): v for k, v in rl.refunded_headers(res)}
    assert {k: headers[k] for k in expected} == expected
    assert headers["limit-tokens"] == b"1000" and headers["limit-requests"] == b"60"
    # and they are what the store says once the refund has really happened
    await rl.settle(res, 0, 0)
    lv, _ = await rl.peek(tenant)
    assert headers["remaining-tokens"] == str(int(lv[1].level)).encode()


# --- peek and the bucket gauge -----------------------------------------------------------------------


async def test_peek_reads_the_refilled_levels_without_taking() -> None:
    clock = FakeClock()
    rl = limiter(clock)
    tenant = acme(rpm=60, tpm=600)
    await rl.reserve(tenant, request(400, 100))
    clock.now += 2.0
    first, source = await rl.peek(tenant)
    again, _ = await rl.peek(tenant)
    assert source == "memory" and first == again
    assert first == (Level(60.0, 0.0, 60.0), Level(120.0, 48.0, 600.0))  # 59 + 2 capped; 100 + 20


async def test_the_bucket_gauge_refills_the_last_level_seen_to_now() -> None:
    clock = FakeClock()
    rl = limiter(clock)
    tenant, other = acme(rpm=60, tpm=600), compile_tenant(TenantConfig(name="other", limits={"tpm": 60}))
    await rl.reserve(tenant, request(400, 100))
    clock.now += 3.0
    samples = {(s.labels["tenant"], s.labels["bucket"]): s.value for m in rl.collect([tenant, other])
               for s in m.samples}  # fmt: skip
    assert samples == {("acme", "requests"): 60.0, ("acme", "tokens"): 130.0, ("other", "tokens"): 60.0}
