"""Per-tenant rate limits over a bucket store: reserve at admission, settle when the response ends.

A request reserves 1 from the tenant's requests bucket (rpm) and its estimated prompt tokens plus its
output cap from the tokens bucket (tpm), both or neither, in one store call. Refusals:

- 429 `rate_limit_error` (code `rate_limit_exceeded`) naming the limit(s) hit, with `Retry-After` =
  the seconds until the bucket holds enough (whole, rounded up) and the `x-ratelimit-*` headers;
- 400 `invalid_request_error` (code `request_too_large`) when the reservation is larger than the
  bucket can EVER hold: waiting never helps, so no Retry-After is given, and a 400 stops the
  automatic 429 retries of OpenAI's SDKs, which would otherwise spin on a request that cannot pass;
- 503 `overloaded_error` when the store is down and the failure mode is fail-closed.

Headers (`x-ratelimit-{limit,remaining,reset}-{requests,tokens}`) describe each bucket after this
request's reservation: limit = bucket capacity (the per-minute limit unless a burst is configured).

Bucket levels seen in replies are kept per tenant (with the local time they were seen) for the
scrape-time gauge; with Redis they are what THIS gateway last saw, refilled to now.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.stores.base import Bucket, BucketStore, Level, StoreUnavailable, Take
from gateway.stores.memory import MemoryBucketStore
from gateway.tenants import Tenant
from policies.ratelimit_headers import limit_headers
from policies.retry_after import retry_after_from_bucket
from policies.types import RequestInfo

Headers = list[tuple[bytes, bytes]]
_PER_MINUTE = {"requests": "requests per minute (RPM)", "tokens": "tokens per minute (TPM)"}


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one admitted request took: `amounts[i]` from `buckets[i]`, in the store `source`;
    `take` is the store's answer (levels after the take), kept for `refunded_headers`."""

    buckets: tuple[Bucket, ...]
    amounts: tuple[float, ...]
    source: str
    take: Take


class RateLimiter:
    """Reserve/settle against one store. One event loop; background refunds are tracked tasks."""

    def __init__(self, store: BucketStore, metrics: GatewayMetrics, clock: Callable[[], float]) -> None:
        self.store = store
        self._m = metrics
        self._clock = clock
        # The memory store never yields inside a call, so no cancellation can land in the middle of
        # one; any other store's take is shielded so a cancelled request can give back what it got.
        self._yields = not isinstance(store, MemoryBucketStore)
        self._seen: dict[tuple[str, str], tuple[float, float]] = {}  # -> (level, local time)
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        await self.store.start()

    async def close(self) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2.0)
        await self.store.close()

    async def reserve(self, tenant: Tenant, info: RequestInfo) -> tuple[Reservation, Headers]:
        """Take the request's reservation or raise GatewayError (429/400/503) as the module says."""
        buckets = tenant.buckets
        amounts = tuple(1.0 if b.kind == "requests" else float(info.reserved_tokens) for b in buckets)
        try:
            take = await (
                self._take_shielded(buckets, amounts) if self._yields else self.store.take(buckets, amounts)
            )
        except StoreUnavailable as err:
            self._m.rejections.labels(tenant.name, "store_unavailable").inc()
            retry = max(1, math.ceil(err.retry_after_s))
            raise GatewayError(
                503,
                "Rate limits cannot be checked right now (the limit store is unreachable). "
                f"Please try again in {retry}s.",
                headers=((b"retry-after", str(retry).encode()),),
            ) from None
        self._remember(buckets, take.levels)
        headers = _headers(buckets, take)
        if not take.allowed:
            raise self._refusal(tenant, info, buckets, amounts, take, headers)
        return Reservation(buckets, amounts, take.source, take), headers

    async def settle(self, res: Reservation, requests: int, tokens: int) -> None:
        """Reconcile: the request used `requests` (0 or 1) and `tokens`. Nothing to do, no call."""
        actual = tuple(float(requests) if b.kind == "requests" else float(tokens) for b in res.buckets)
        if actual == res.amounts:
            return
        settled = await self.store.settle(res.buckets, res.amounts, actual, res.source)
        if settled is not None:
            self._remember(res.buckets, tuple(lv.level for lv in settled.levels))

    @staticmethod
    def refunded_headers(res: Reservation) -> Headers:
        """The `x-ratelimit-*` headers as they stand once `res` is given back in full: for a request
        refused after its reservation (flow control's 503), which used nothing. Levels as of the take,
        plus the amounts; a bucket refilled by the amount is that much sooner full."""
        take = res.take
        out: Headers = []
        for b, amount, cap, level, reset in zip(
            res.buckets, res.amounts, take.capacities, take.levels, take.reset_s, strict=True
        ):
            refill = b.spec.refill_per_s * cap / b.spec.capacity  # a fail-open share refills its share
            out += limit_headers(b.kind, cap, min(cap, level + amount), max(0.0, reset - amount / refill))
        return out

    def refund_later(self, res: Reservation) -> None:
        """Give the whole reservation back in the background (the request never ran)."""
        self.spawn(self.settle(res, 0, 0))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def peek(self, tenant: Tenant) -> tuple[tuple[Level, ...], str]:
        return await self.store.peek(tenant.buckets)

    async def _take_shielded(self, buckets: tuple[Bucket, ...], amounts: tuple[float, ...]) -> Take:
        inner = asyncio.ensure_future(self.store.take(buckets, amounts))
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            inner.add_done_callback(lambda t: self._give_back(t, buckets, amounts))
            raise

    def _give_back(
        self, t: asyncio.Future[Take], buckets: tuple[Bucket, ...], amounts: tuple[float, ...]
    ) -> None:
        if t.cancelled() or t.exception() is not None:
            return
        take = t.result()
        if take.allowed:
            self.spawn(self.settle(Reservation(buckets, amounts, take.source, take), 0, 0))

    def _remember(self, buckets: tuple[Bucket, ...], levels: tuple[float, ...]) -> None:
        now = self._clock()
        for b, level in zip(buckets, levels, strict=True):
            self._seen[(b.tenant, b.kind)] = (level, now)

    def collect(self, tenants: Iterable[Tenant]) -> Iterable[Metric]:
        """Bucket levels as last seen by this gateway, refilled to now (scrape-time gauge)."""
        fam = GaugeMetricFamily(
            "kvgate_tenant_bucket_level",
            "Tokens or requests left in a tenant's bucket (as this gateway last saw it, refilled to "
            "now; negative = debt from an overrun).",
            labels=["tenant", "bucket"],
        )
        now = self._clock()
        for t in tenants:
            for b in t.buckets:
                seen = self._seen.get((b.tenant, b.kind))
                level = b.spec.capacity
                if seen is not None:
                    level = min(b.spec.capacity, seen[0] + max(0.0, now - seen[1]) * b.spec.refill_per_s)
                fam.add_metric([t.name, b.kind], level)
        yield fam

    def _refusal(
        self,
        tenant: Tenant,
        info: RequestInfo,
        buckets: tuple[Bucket, ...],
        amounts: tuple[float, ...],
        take: Take,
        headers: Headers,
    ) -> GatewayError:
        name = tenant.name
        if take.too_large:
            self._m.rejections.labels(name, "too_large").inc()
            i = next(i for i in take.limiting if amounts[i] > take.capacities[i])
            return GatewayError(
                400,
                f"Request too large for tenant '{name}' on {_PER_MINUTE[buckets[i].kind]}: "
                f"{_limit_text(tenant, buckets[i], take.capacities[i])}, requested {int(amounts[i])} "
                f"({info.prompt_tokens} prompt + {info.max_tokens} max output tokens). "
                "Reduce the prompt or max_tokens.",
                param="max_tokens",
                code="request_too_large",
                headers=tuple(headers),
            )
        kinds = [buckets[i].kind for i in take.limiting]
        self._m.rejections.labels(name, "rate_limit_" + ("tokens" if "tokens" in kinds else "requests")).inc()
        retry = retry_after_from_bucket(take.retry_after_s)
        parts = [
            f"on {_PER_MINUTE[buckets[i].kind]}: {_limit_text(tenant, buckets[i], take.capacities[i])}, "
            f"remaining {max(0, math.floor(take.levels[i]))}, requested {int(amounts[i])}"
            for i in take.limiting
        ]
        return GatewayError(
            429,
            f"Rate limit reached for tenant '{name}' "
            + "; ".join(parts)
            + f". Please try again in {retry}s.",
            code="rate_limit_exceeded",
            headers=((b"retry-after", str(retry).encode()), *headers),
        )


def _limit_text(tenant: Tenant, b: Bucket, capacity: float) -> str:
    per_minute = tenant.rpm if b.kind == "requests" else tenant.tpm
    text = f"limit {per_minute} per minute"
    if per_minute is None or capacity != per_minute:
        text += f" (bucket holds {capacity:g})"
    return text


def _headers(buckets: tuple[Bucket, ...], take: Take) -> Headers:
    out: Headers = []
    for b, cap, level, reset in zip(buckets, take.capacities, take.levels, take.reset_s, strict=True):
        out += limit_headers(b.kind, cap, level, reset)
    return out
