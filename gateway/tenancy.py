"""Who is asking, and may they go now: authentication, allow-lists, rate limits, flow control.

The seam between the proxy and tenant policy. Per request, in this order:

1. `authenticate` (sync): `Authorization: Bearer KEY` -> Tenant, or 401. Open gateway (no tenants
   configured): everyone is the unlimited anonymous tenant and nothing below touches a store.
2. `check_model` (sync): the tenant's allow-list, or 403.
3. `admit`: band from the tenant's default or `x-kvgate-priority` (lower only; unknown -> 400);
   `max_concurrency` (429); the rate limit reservation (one store call; 429/400/503); then flow
   control (`AdmissionQueue`: start, wait, or 503). Rate limits come BEFORE the queue: a client over
   its limit is told at once instead of after waiting, and never holds a queue slot.
4. `settle(admitted, usage, outcome)` exactly once when the response has ended, whatever happened.

What a request is charged when it ends (`charge_for`):

- the replica reported usage: `prompt_tokens + completion_tokens`, 1 request;
- no usage, but a replica was working on it (the stream broke, or the client left mid-stream or
  while the replica was prefilling): the best estimate, prompt tokens (the admission estimate, exact
  with a tokenizer) + one token per SSE event relayed (the role chunk counts as one, so this may
  over-charge by one), at most the output cap reserved (a replica cannot be made to charge more than
  the request could produce), 1 request;
- a replica answered an error status itself (4xx/5xx passed through): 0 tokens, 1 request;
- it never reached a replica, or every attempt failed before any answer (kvgate answered 502/503/504
  itself, or the client left before dispatch): 0 tokens and 0 requests, the whole reservation comes
  back: the tenant got no service, and its retries during an outage must not eat its quota.

A request refused in `admit` after its reservation (queue full, timeout, the client leaving while
queued) gets the reservation back in full, requests included: a queued request that leaves settles
nothing. Its 503 still carries the `x-ratelimit-*` headers, as they stand after that refund. The
reservation is taken at arrival rather than at dispatch so that the 429 comes at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.admission import AdmissionQueue
from gateway.auth_keys import bearer_token
from gateway.config import Config, TenantLimits
from gateway.errors import GatewayError
from gateway.fleet.state import FleetChange, FleetState
from gateway.forwarder import Outcome
from gateway.metrics import GatewayMetrics
from gateway.rate_limit import RateLimiter, Reservation
from gateway.reload import ReloadStep
from gateway.sse_filter import Usage
from gateway.stores import StoreUnavailable, build_store
from gateway.tenants import ANONYMOUS, Tenant, TenantRegistry
from policies.tenancy import choose_band
from policies.types import Band, RequestInfo

__all__ = ["ANONYMOUS", "Admitted", "Charge", "Tenancy", "Tenant", "charge_for"]

_DEFAULT_OUTPUT_CAP = TenantLimits().max_output_tokens
_NO_TENANT = "unknown"  # metric label for requests refused before a tenant is known


@dataclass(slots=True)
class Admitted:
    """A request that may be dispatched; `settle` must be called exactly once when it ends."""

    info: RequestInfo
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    vllm_priority: int | None = None
    tenant: Tenant | None = None
    reservation: Reservation | None = None
    pool: str | None = None  # the flow-control pool that counts it in flight, until settled
    settled: bool = False


@dataclass(frozen=True, slots=True)
class Charge:
    requests: int  # 0 or 1
    tokens: int


@dataclass(slots=True)
class _Totals:
    requests: int = 0
    tokens: int = 0


def charge_for(info: RequestInfo, usage: Usage | None, outcome: Outcome | None) -> Charge:
    """What the tenant is charged for a request that ended (rules in the module docstring)."""
    if usage is not None:
        return Charge(1, usage.prompt_tokens + usage.completion_tokens)
    if outcome is None or outcome.attempts == 0:
        return Charge(0, 0)
    if outcome.status == 0:
        if outcome.error_kind is not None:
            return Charge(0, 0)
        return Charge(1, info.prompt_tokens)
    if outcome.status == 200:
        return Charge(1, info.prompt_tokens + min(outcome.events, info.max_tokens))
    return Charge(1, 0)


class Tenancy:
    """Tenant policy of one Gateway. One event loop; `admit`/`settle` are safe to run concurrently."""

    def __init__(
        self,
        config: Config,
        fleet: FleetState,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = TenantRegistry(config)
        self._m = metrics
        self._clock = clock
        self.limiter: RateLimiter | None = None
        # A shared store is connected at start even before any limit needs it: a reload may bring
        # the first limit, and a remote store needs connecting (gateway/reload.py commits are sync).
        if self.registry.any_limits or config.state.store != "memory://":
            self.limiter = RateLimiter(build_store(config.state, metrics, clock), metrics, clock)
        fc = config.flow_control
        self.admission: AdmissionQueue | None = None
        if fc.enabled:
            self.admission = AdmissionQueue(fc, config.fleet.stale_after_s, fleet, metrics, clock)
        self._pass_priority = fc.pass_priority
        self._in_flight: dict[str, int] = {}
        self._totals: dict[str, _Totals] = {}
        # Labelled metric children, looked up once per label set (labels() costs a few us a call).
        self._admitted: dict[tuple[str, Band, str], Counter] = {}
        self._charged: dict[str, Counter] = {}
        self.started_at = time.time()
        metrics.add_callback(self._collect)

    async def start(self) -> None:
        if self.limiter is not None:
            await self.limiter.start()

    async def stop(self) -> None:
        if self.admission is not None:
            self.admission.close()
        if self.limiter is not None:
            await self.limiter.close()

    def prepare(self, old: Config, new: Config) -> ReloadStep:
        """Reload (gateway/reload.py): a new tenant registry (tenants, keys, limits, bands, weights,
        admin keys) and flow-control settings. Buckets live in the store keyed by tenant name, so a
        tenant keeps its levels under new limits; requests in flight keep the Tenant they started
        with, and settle against the buckets they reserved from."""
        # Hook for live keys and quotas (#15): lay the admin API's changes over the new file here.
        registry = TenantRegistry(new)
        limiter = self.limiter
        if limiter is None and registry.any_limits:
            # The first limits: `state` is restart-only and a remote store is built at start, so this
            # is the in-process store, which needs no start.
            limiter = RateLimiter(build_store(new.state, self._m, self._clock), self._m, self._clock)
        fc = new.flow_control

        def commit() -> None:
            self.registry = registry
            self.limiter = limiter
            self._pass_priority = fc.pass_priority
            if self.admission is not None:
                self.admission.reconfigure(fc)

        return ReloadStep(commit)

    def on_fleet_change(self, replica: str, change: FleetChange) -> None:
        if self.admission is not None:
            self.admission.on_fleet_change(replica, change)

    # -- the request path -----------------------------------------------------------------------

    def authenticate(self, authorization: bytes | None) -> Tenant:
        reg = self.registry
        if reg.open:
            assert reg.keyless is not None
            return reg.keyless
        token = bearer_token(authorization)
        if token is None:
            if reg.keyless is not None:
                return reg.keyless
            self._m.rejections.labels(_NO_TENANT, "unauthenticated").inc()
            raise GatewayError(
                401,
                "You didn't provide an API key. Send it as `Authorization: Bearer <key>`.",
                code="missing_api_key",
            )
        tenant = reg.by_key(token)
        if tenant is None:
            self._m.rejections.labels(_NO_TENANT, "unauthenticated").inc()
            raise GatewayError(401, "Incorrect API key provided.", code="invalid_api_key")
        return tenant

    def check_model(self, tenant: Tenant, model: str) -> None:
        if not tenant.models.allows(model):
            self._m.rejections.labels(tenant.name, "model_not_allowed").inc()
            raise GatewayError(
                403,
                f"Tenant '{tenant.name}' is not allowed to use the model `{model}`.",
                param="model",
                code="model_not_allowed",
            )

    def output_cap(self, tenant: Tenant) -> int | None:
        """The output cap kvgate enforces for `tenant`, or None when no tenants are configured.

        With tenants, `limits.max_output_tokens` is a limit, not just the reservation's default: a
        larger `max_tokens` is refused (400) and a missing one is set to it in the body sent to the
        replica, so a response can never outgrow what was reserved for it. Without tenants, the
        replica's own default applies, as it would without kvgate.
        """
        return None if self.registry.open else tenant.max_output_tokens

    def default_max_tokens(self, tenant: str) -> int:
        t = self.registry.get(tenant)
        return t.max_output_tokens if t is not None else _DEFAULT_OUTPUT_CAP

    async def admit(self, tenant: Tenant, info: RequestInfo, priority: bytes | None) -> Admitted:
        """Pass the request through concurrency, rate limits and flow control, or raise GatewayError.
        The caller dispatches right away (no await in between) and settles exactly once."""
        name = tenant.name
        try:
            band = choose_band(tenant.band, priority.decode("latin-1") if priority else None)
        except ValueError as err:
            self._m.rejections.labels(name, "bad_priority").inc()
            raise GatewayError(400, f"x-kvgate-priority: {err}", param="x-kvgate-priority") from None
        running = self._in_flight.get(name, 0)
        if tenant.max_concurrency is not None and running >= tenant.max_concurrency:
            self._m.rejections.labels(name, "concurrency").inc()
            raise GatewayError(
                429,
                f"Too many concurrent requests for tenant '{name}' (limit {tenant.max_concurrency}). "
                "Please try again in 1s.",
                code="concurrency_limit_exceeded",
                headers=((b"retry-after", b"1"),),
            )
        self._in_flight[name] = running + 1  # held from here: concurrent admits cannot all pass
        reservation: Reservation | None = None
        headers: list[tuple[bytes, bytes]] = []
        ok = False
        try:
            if tenant.limited and self.limiter is not None:
                reservation, headers = await self.limiter.reserve(tenant, info)
            path = "direct"
            pool = None
            if self.admission is not None:
                try:
                    path = await self.admission.enter(
                        info.base_model, name, tenant.weight, band, info.reserved_tokens
                    )
                except GatewayError as err:
                    if reservation is None:
                        raise
                    # Refused by flow control: the reservation comes back, and the answer still says
                    # where the tenant's limits stand (every response carries them).
                    more = tuple(RateLimiter.refunded_headers(reservation))
                    raise replace(err, headers=err.headers + more) from None
                pool = info.base_model
            ok = True
        finally:
            if not ok:
                self._in_flight[name] -= 1
                if reservation is not None and self.limiter is not None:
                    self.limiter.refund_later(reservation)
        counter = self._admitted.get((name, band, path))
        if counter is None:
            counter = self._admitted[(name, band, path)] = self._m.admissions.labels(name, band.label, path)
        counter.inc()
        if band != info.band:
            info = replace(info, band=band)
        return Admitted(
            info=info,
            headers=headers,
            vllm_priority=int(band) if self._pass_priority else None,
            tenant=tenant,
            reservation=reservation,
            pool=pool,
        )

    async def settle(self, admitted: Admitted, usage: Usage | None, outcome: Outcome | None) -> None:
        """Charge what the request used (see `charge_for`) and free its concurrency slot. Idempotent."""
        if admitted.settled or admitted.tenant is None:
            return
        admitted.settled = True
        name = admitted.tenant.name
        self._in_flight[name] -= 1
        if admitted.pool is not None and self.admission is not None:
            self.admission.leave(admitted.pool, name)
        charge = charge_for(admitted.info, usage, outcome)
        totals = self._totals.get(name)
        if totals is None:
            totals = self._totals[name] = _Totals()
        totals.requests += charge.requests
        totals.tokens += charge.tokens
        if charge.tokens:
            counter = self._charged.get(name)
            if counter is None:
                counter = self._charged[name] = self._m.tokens_charged.labels(name)
            counter.inc(charge.tokens)
        if admitted.reservation is not None and self.limiter is not None:
            await self.limiter.settle(admitted.reservation, charge.requests, charge.tokens)

    # -- admin and metrics ----------------------------------------------------------------------

    def tenants(self) -> tuple[Tenant, ...]:
        reg = self.registry
        extra = (reg.keyless,) if reg.open and reg.keyless is not None else ()
        return reg.tenants + extra

    def find(self, name: str) -> Tenant | None:
        return next((t for t in self.tenants() if t.name == name), None)

    def summary(self, t: Tenant) -> dict[str, Any]:
        """What this gateway knows about `t` without asking the store."""
        totals = self._totals.get(t.name, _Totals())
        return {
            "name": t.name,
            "priority": t.band.label,
            "weight": t.weight,
            "limits": {
                "rpm": t.rpm,
                "tpm": t.tpm,
                "max_concurrency": t.max_concurrency,
                "max_output_tokens": t.max_output_tokens,
            },
            "in_flight": self._in_flight.get(t.name, 0),
            "queued": self.admission.depth_of(t.name) if self.admission is not None else 0,
            "used": {"requests": totals.requests, "tokens": totals.tokens, "since": self.started_at},
        }

    async def status(self, t: Tenant) -> dict[str, Any]:
        """`summary` plus the buckets' levels read from the store now (one store call)."""
        out = self.summary(t)
        out["buckets"] = {}
        if not t.limited or self.limiter is None:
            return out
        try:
            async with asyncio.timeout(2.0):
                levels, source = await self.limiter.peek(t)
        except (StoreUnavailable, TimeoutError):
            out["buckets"] = None
            out["store"] = "unavailable"
            return out
        out["store"] = source
        for b, lv in zip(t.buckets, levels, strict=True):
            out["buckets"][b.kind] = {
                "capacity": lv.capacity,
                "level": lv.level,
                "remaining": max(0, int(lv.level)),
                "refill_per_s": b.spec.refill_per_s,
                "reset_s": lv.reset_s,
            }
        return out

    def _collect(self) -> Iterable[Metric]:
        fam = GaugeMetricFamily(
            "kvgate_tenant_in_flight",
            "Admitted requests of each tenant not yet finished (queued or running).",
            labels=["tenant"],
        )
        for name, n in self._in_flight.items():
            fam.add_metric([name], n)
        yield fam
        if self.admission is not None:
            yield from self.admission.collect()
        if self.limiter is not None:
            yield from self.limiter.collect(self.registry.tenants)
