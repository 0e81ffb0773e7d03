"""Per-tenant rate limits and quotas over a limit store: reserve at admission, settle at the end.

A request reserves 1 from the tenant's requests bucket (rpm) and its estimated prompt tokens plus its
output cap from the tokens bucket (tpm) — and the same from its key's buckets, and its share of every
quota counter it meets (`gateway/quotas.py`) — all or nothing, in one store call. Refusals:

- 429 `rate_limit_error` (code `rate_limit_exceeded`) naming the limit(s) hit, with `Retry-After` =
  the seconds until the bucket holds enough (whole, rounded up) and the `x-ratelimit-*` headers;
- 400 `invalid_request_error` (code `request_too_large`) when the reservation is larger than the
  bucket can EVER hold: waiting never helps, so no Retry-After is given, and a 400 stops the
  automatic 429 retries of OpenAI's SDKs, which would otherwise spin on a request that cannot pass;
- 503 `overloaded_error` when the store is down and the failure mode is fail-closed;
- a quota: 429 `insufficient_quota` or 400 `request_too_large` (`gateway/quotas.py`).

Headers (`x-ratelimit-{limit,remaining,reset}-{requests,tokens}`) describe each bucket after this
request's reservation: limit = bucket capacity (the per-minute limit unless a burst is configured).
A tenant's and its key's bucket of one kind share the header names: the one with less left is shown.
`x-kvgate-quota-*` describe the tightest quota.

Bucket levels seen in replies are kept per tenant (with the local time they were seen) for the
scrape-time gauge; with Redis they are what THIS gateway last saw, refilled to now.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from gateway import quotas
from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.quotas import NO_PLAN, QuotaPlan
from gateway.stores.base import Bucket, BucketStore, Level, StoreUnavailable, Take
from gateway.stores.memory import MemoryBucketStore
from gateway.tenants import NO_KEY, Tenant
from policies.ratelimit_headers import limit_headers
from policies.retry_after import retry_after_from_bucket
from policies.types import RequestInfo

Headers = list[tuple[bytes, bytes]]
_PER_MINUTE = {"requests": "requests per minute (RPM)", "tokens": "tokens per minute (TPM)"}


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one admitted request took: `amounts[i]` from `buckets[i]` and `quota.amounts[j]` from its
    quota counters, in the store `source`; `take` is the store's answer (levels after the take),
    kept for `refunded_headers`; `at` the wall-clock time it was taken."""

    buckets: tuple[Bucket, ...]
    amounts: tuple[float, ...]
    source: str
    take: Take
    quota: QuotaPlan = NO_PLAN
    at: float = 0.0


class RateLimiter:
    """Reserve/settle against one store. One event loop; background refunds are tracked tasks."""

    def __init__(
        self,
        store: BucketStore,
        metrics: GatewayMetrics,
        clock: Callable[[], float],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._m = metrics
        self._clock = clock
        self.wall_clock = wall_clock
        # The memory store never yields inside a call, so no cancellation can land in the middle of
        # one; any other store's take is shielded so a cancelled request can give back what it got.
        self._yields = not isinstance(store, MemoryBucketStore)
        self._seen: dict[tuple[str, str], tuple[float, float]] = {}  # -> (level, local time)
        self._warned: dict[tuple[str, str, str], Any] = {}  # metric children by (tenant, key, quota)
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
        now = 0.0
        qp = NO_PLAN
        if tenant.quotas:
            now = self.wall_clock()
            try:
                qp = quotas.plan(tenant.quotas, info, now)
            except GatewayError:
                self._m.rejections.labels(tenant.name, "too_large").inc()
                raise
        try:
            if self._yields:
                take = await self._take_shielded(buckets, amounts, qp)
            else:
                take = await self.store.take(buckets, amounts, qp.counters, qp.amounts)
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
        merge = tenant.key is not None and bool(tenant.key.buckets)
        headers = _headers(buckets, take, merge)
        if qp.quotas:
            headers += quotas.headers(qp, take.used, now)
            if take.crossed:
                self._crossed(qp, take.crossed, take.used, now)
        if not take.allowed:
            if take.counter_limiting and not take.too_large:
                self._m.rejections.labels(tenant.name, "quota").inc()
                wait_s = take.retry_after_s if take.limiting else 0.0
                bucket_headers = _headers(buckets, take, merge)
                raise quotas.refusal(qp, take.used, take.counter_limiting, now, wait_s, bucket_headers)
            raise self._refusal(tenant, info, buckets, amounts, take, headers)
        return Reservation(buckets, amounts, take.source, take, qp, now), headers

    async def settle(self, res: Reservation, requests: int, tokens: int) -> None:
        """Reconcile: the request used `requests` (0 or 1) and `tokens`. Nothing to do, no call."""
        actual = tuple(float(requests) if b.kind == "requests" else float(tokens) for b in res.buckets)
        qp = res.quota
        if qp.quotas:
            # Only the counters whose use differs from their reservation: settling the others
            # changes nothing (and cannot cross a warning), so they cost no store work.
            used = [q.charged(requests, tokens) for q in qp.quotas]
            keep = [i for i, (u, r) in enumerate(zip(used, qp.amounts, strict=True)) if u != r]
            q_actual = tuple(used[i] for i in keep)
            if len(keep) < len(used):
                qp = QuotaPlan(
                    tuple(qp.quotas[i] for i in keep),
                    tuple(qp.counters[i] for i in keep),
                    tuple(qp.amounts[i] for i in keep),
                )
        else:
            q_actual = ()
        if actual == res.amounts and not q_actual:
            return
        settled = await self.store.settle(
            res.buckets, res.amounts, actual, res.source, qp.counters, qp.amounts, q_actual
        )
        if settled is not None:
            self._remember(res.buckets, tuple(lv.level for lv in settled.levels))
            if settled.crossed:
                self._crossed(qp, settled.crossed, settled.used, self.wall_clock())

    def _crossed(self, qp: QuotaPlan, crossed: Sequence[int], used: Sequence[float], now: float) -> None:
        for i in crossed:
            q = qp.quotas[i]
            labels = (q.tenant, q.key or NO_KEY, q.name)
            child = self._warned.get(labels)
            if child is None:
                child = self._warned[labels] = self._m.quota_warnings.labels(*labels)
            child.inc()
            quotas.report_crossing(q, used[i], now)

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
        if any(b.key is not None for b in res.buckets):
            out = _tightest(out)
        qp = res.quota
        if qp.quotas and len(take.used) == len(qp.quotas):
            out += quotas.headers(qp, [u - a for u, a in zip(take.used, qp.amounts, strict=True)], res.at)
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

    async def _take_shielded(
        self, buckets: tuple[Bucket, ...], amounts: tuple[float, ...], qp: QuotaPlan
    ) -> Take:
        inner = asyncio.ensure_future(self.store.take(buckets, amounts, qp.counters, qp.amounts))
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            inner.add_done_callback(lambda t: self._give_back(t, buckets, amounts, qp))
            raise

    def _give_back(
        self, t: asyncio.Future[Take], buckets: tuple[Bucket, ...], amounts: tuple[float, ...], qp: QuotaPlan
    ) -> None:
        if t.cancelled() or t.exception() is not None:
            return
        take = t.result()
        if take.allowed:
            self.spawn(self.settle(Reservation(buckets, amounts, take.source, take, qp), 0, 0))

    def _remember(self, buckets: tuple[Bucket, ...], levels: tuple[float, ...]) -> None:
        now = self._clock()
        for b, level in zip(buckets, levels, strict=True):
            self._seen[(b.tenant, b.name)] = (level, now)

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
            for b in t.tenant_buckets:
                seen = self._seen.get((b.tenant, b.name))
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
                f"Request too large for {_owner(tenant, buckets[i])} on {_PER_MINUTE[buckets[i].kind]}: "
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
            f"Rate limit reached for {_owner(tenant, buckets[take.limiting[0]])} "
            + "; ".join(parts)
            + f". Please try again in {retry}s.",
            code="rate_limit_exceeded",
            headers=((b"retry-after", str(retry).encode()), *headers),
        )


def _owner(tenant: Tenant, b: Bucket) -> str:
    return f"tenant '{tenant.name}'" if b.key is None else f"key '{b.key}' of tenant '{tenant.name}'"


def _limit_text(tenant: Tenant, b: Bucket, capacity: float) -> str:
    src = tenant.key if b.key is not None and tenant.key is not None else tenant
    per_minute = src.rpm if b.kind == "requests" else src.tpm
    text = f"limit {per_minute} per minute"
    if per_minute is None or capacity != per_minute:
        text += f" (bucket holds {capacity:g})"
    return text


def _headers(buckets: tuple[Bucket, ...], take: Take, merge: bool) -> Headers:
    """The buckets' `x-ratelimit-*`; `merge` when a key's buckets join its tenant's (one set per kind)."""
    out: Headers = []
    for b, cap, level, reset in zip(buckets, take.capacities, take.levels, take.reset_s, strict=True):
        out += limit_headers(b.kind, cap, level, reset)
    return _tightest(out) if merge else out


def _tightest(headers: Headers) -> Headers:
    """One header set per kind: where a tenant's and its key's bucket both gave one, the one with
    less remaining (the limit the client will meet first)."""
    best: dict[bytes, tuple[int, Headers]] = {}
    rest: Headers = []
    for i in range(len(headers)):
        name = headers[i][0]
        if name.startswith(b"x-ratelimit-limit-"):
            kind = name.removeprefix(b"x-ratelimit-limit-")
            trio = headers[i : i + 3]
            left = int(trio[1][1])
            if kind not in best or left < best[kind][0]:
                best[kind] = (left, trio)
        elif not name.startswith(b"x-ratelimit-"):
            rest.append(headers[i])
    return [h for _, trio in best.values() for h in trio] + rest
