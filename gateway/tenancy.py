"""Who is asking, and may they go now: the seam between the proxy and tenant policy.

Per request, in this order:

1. `authenticate` (sync): `Authorization: Bearer KEY` -> the principal (a tenant, as it applies to
   that key), or 401. Open gateway (no tenants configured): everyone is the unlimited anonymous
   tenant and nothing below touches a store. The key table is in process (`TenantRegistry`), kept
   in step with the admin API's changes by `gateway/policy_sync.py`: no store call.
2. `check_model` (sync): the tenant's allow-list, or 403.
3. `admit`: band from the tenant's default or `x-kvgate-priority` (lower only; unknown -> 400);
   `max_concurrency` of the tenant and of the key (429); the rate limit and quota reservation (one
   store call; 429/400/503); then flow control (`AdmissionQueue`: start, wait, or 503). Limits come
   BEFORE the queue: a client over its limit is told at once instead of after waiting, and never
   holds a queue slot.
4. `settle(admitted, usage, outcome)` exactly once when the response has ended, whatever happened:
   the charge (`policies.charging`) goes to the buckets and quotas (one store call) and to the usage
   ledger (an in-process buffer, written in batches: `gateway/ledger.py`).

A request refused in `admit` after its reservation (queue full, timeout, the client leaving while
queued) gets the reservation back in full, requests included: a queued request that leaves settles
nothing. Its 503 still carries the `x-ratelimit-*` headers, as they stand after that refund. The
reservation is taken at arrival rather than at dispatch so that the 429 comes at once.

Admin and metrics views of this state are in `gateway/tenant_status.py`.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.admission import AdmissionQueue
from gateway.auth_keys import bearer_token
from gateway.config import Config, TenantLimits
from gateway.errors import GatewayError
from gateway.fleet.state import FleetChange, FleetState
from gateway.forwarder import Outcome
from gateway.ledger import UsageLedger
from gateway.metrics import GatewayMetrics
from gateway.policy_overrides import Overrides
from gateway.policy_sync import PolicySync, build_policy_sync
from gateway.rate_limit import RateLimiter, Reservation
from gateway.reload import ReloadStep
from gateway.sse_filter import Usage
from gateway.stores import build_ledger_store, build_store
from gateway.tenants import ANONYMOUS, Tenant, TenantRegistry
from policies.charging import Charge, charge
from policies.latency.estimator import LatencyEstimator
from policies.latency_admission import TTFT_SLO_HEADER, LatencySlo, parse_ttft_slo_header
from policies.tenancy import choose_band
from policies.types import Band, RequestInfo

__all__ = ["ANONYMOUS", "Admitted", "Charge", "Tenancy", "Tenant", "charge_for"]

_DEFAULT_OUTPUT_CAP = TenantLimits().max_output_tokens
_NO_TENANT = "unknown"  # metric label for requests refused before a tenant is known


PRIORITY_HEADER = "x-kvgate-priority"


def request_band(tenant: Tenant, priority: bytes | None) -> Band:
    """The request's band: the tenant's, or a lower one asked for in `x-kvgate-priority`.
    GatewayError 400 for a band name it does not know."""
    try:
        return choose_band(tenant.band, priority.decode("latin-1") if priority else None)
    except ValueError as err:
        raise GatewayError(400, f"{PRIORITY_HEADER}: {err}", param=PRIORITY_HEADER) from None


def request_slo(tenant: Tenant, ttft_slo: bytes | None) -> LatencySlo:
    """The tenant's SLO tightened by the request's `x-kvgate-ttft-slo-ms` (it can only tighten).
    GatewayError 400 for a malformed value."""
    try:
        return tenant.slo.tighten(LatencySlo(parse_ttft_slo_header(ttft_slo)))
    except ValueError as err:
        raise GatewayError(400, f"{TTFT_SLO_HEADER}: {err}", param=TTFT_SLO_HEADER) from None


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


@dataclass(slots=True)
class Totals:
    requests: int = 0
    tokens: int = 0


def charge_for(info: RequestInfo, usage: Usage | None, outcome: Outcome | None) -> Charge:
    """What the tenant is charged for a request that ended (`policies.charging`)."""
    o = outcome if outcome is not None else Outcome()
    u = (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) if usage is not None else None
    return charge(
        info.prompt_tokens,
        u,
        attempts=o.attempts,
        status=o.status,
        error_kind=o.error_kind,
        events=o.events,
        output_cap=info.max_tokens,
    )


def ledger_model(info: RequestInfo) -> str:
    """The ledger's model column: the canonical name of what served the request (`base` or
    `base:adapter`, whatever name the client used for it), as `route->target` when the client named a
    route, so a platform team sees both the name it sold and the variant that answered."""
    target = info.target or info.model
    return f"{info.route}->{target}" if info.route else target


def new_gateway_id() -> str:
    """Names this process in the store's heartbeats and the ledger's batch ids: host, pid, random."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Tenancy:
    """Tenant policy of one Gateway. One event loop; `admit`/`settle` are safe to run concurrently.

    `clock` is monotonic (buckets, queues); `wall_clock` is Unix time (quota windows, the ledger's
    hours). `registry` is replaced whole when the admin API's changes arrive; a request keeps the
    principal it authenticated as."""

    def __init__(
        self,
        config: Config,
        fleet: FleetState,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        gateway_id: str | None = None,
        latency: LatencyEstimator | None = None,
    ) -> None:
        self.config = config
        self.registry = TenantRegistry(config)
        self._m = metrics
        self.wall_clock = wall_clock
        self._clock = clock
        self.gateway_id = gateway_id or new_gateway_id()
        self.limiter: RateLimiter | None = None
        self.ledger: UsageLedger | None = None
        self.sync: PolicySync | None = None
        # A shared store is connected at start even before any tenant needs it: a reload may bring
        # the first tenants, and a remote store needs connecting (reload commits are synchronous).
        if not self.registry.open or config.state.store != "memory://":
            self._build_stores(config)
        fc = config.flow_control
        self.admission: AdmissionQueue | None = None
        if fc.enabled:
            self.admission = AdmissionQueue(fc, config.fleet.stale_after_s, fleet, metrics, clock, latency)
        self._pass_priority = fc.pass_priority
        self.in_flight: dict[str, int] = {}
        self.key_in_flight: dict[tuple[str, str], int] = {}
        self.totals: dict[str, Totals] = {}
        # Labelled metric children, looked up once per label set (labels() costs a few us a call).
        self._admitted: dict[tuple[str, Band, str], Counter] = {}
        self._charged: dict[str, Counter] = {}
        self.started_at = time.time()
        metrics.add_callback(self._collect)

    async def start(self) -> None:
        if self.limiter is not None:
            await self.limiter.start()
        if self.sync is not None:
            await self.sync.start()
        if self.ledger is not None:
            await self.ledger.start()

    async def stop(self) -> None:
        if self.admission is not None:
            self.admission.close()
        if self.sync is not None:
            await self.sync.stop()
        if self.ledger is not None:
            await self.ledger.stop()
        if self.limiter is not None:
            await self.limiter.close()

    def _build_stores(self, config: Config) -> None:
        """The rate-limit store, the usage ledger and the admin changes' sync for `config.state`."""
        self.limiter = RateLimiter(
            build_store(config.state, self._m, self._clock, self.wall_clock, config.limit_processes),
            self._m,
            self._clock,
            self.wall_clock,
        )
        if config.ledger.enabled:
            ledger_store = build_ledger_store(config.state, config.ledger, self.wall_clock)
            self.ledger = UsageLedger(ledger_store, config.ledger, self._m, self.gateway_id, self.wall_clock)
        self.sync = build_policy_sync(
            config.state, self.apply_overrides, self._m, self.gateway_id, self.wall_clock
        )

    def apply_overrides(self, overrides: Overrides) -> None:
        """Swap in the registry of the config with the admin API's changes laid over it."""
        self.registry = TenantRegistry(self.config, overrides)

    def prepare(self, old: Config, new: Config) -> ReloadStep:
        """Reload (gateway/reload.py): a new tenant registry (tenants, keys, limits, quotas, bands,
        weights, admin keys) with the admin API's changes laid over it again, and flow-control
        settings. Buckets and quota counters live in the store keyed by tenant (and key) name, so a
        tenant keeps its levels under new limits; requests in flight keep the Tenant they started
        with, and settle against what they reserved. A reload that brings the first tenants to a
        gateway that started open (memory store) builds the stores then; they start in `settle`."""
        registry = TenantRegistry(new, self.registry.overrides)
        first = self.limiter is None and not registry.open
        fc = new.flow_control

        def commit() -> None:
            self.config = new
            self.registry = registry
            if first:
                self._build_stores(new)
            self._pass_priority = fc.pass_priority
            if self.admission is not None:
                self.admission.reconfigure(fc)

        async def settle() -> None:
            if first:
                await self.start()

        return ReloadStep(commit, settle if first else None)

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

    def _concurrency(self, tenant: Tenant) -> None:
        """Refuse (429) when the tenant or its key is at its `max_concurrency` on this gateway."""
        name = tenant.name
        if tenant.max_concurrency is not None and self.in_flight.get(name, 0) >= tenant.max_concurrency:
            limit, who = tenant.max_concurrency, f"tenant '{name}'"
        else:
            key = tenant.key
            if key is None or key.max_concurrency is None:
                return
            if self.key_in_flight.get((name, key.name), 0) < key.max_concurrency:
                return
            limit, who = key.max_concurrency, f"key '{key.name}' of tenant '{name}'"
        self._m.rejections.labels(name, "concurrency").inc()
        raise GatewayError(
            429,
            f"Too many concurrent requests for {who} (limit {limit}). Please try again in 1s.",
            code="concurrency_limit_exceeded",
            headers=((b"retry-after", b"1"),),
        )

    def _hold(self, tenant: Tenant, n: int) -> None:
        """Count `n` (+1 or -1) of the tenant's requests in flight, and of its key's when the key
        has a concurrency limit (the common case pays one dict update)."""
        self.in_flight[tenant.name] = self.in_flight.get(tenant.name, 0) + n
        key = tenant.key
        if key is not None and key.max_concurrency is not None:
            k = (tenant.name, key.name)
            self.key_in_flight[k] = self.key_in_flight.get(k, 0) + n

    async def admit(
        self, tenant: Tenant, info: RequestInfo, priority: bytes | None, ttft_slo: bytes | None = None
    ) -> Admitted:
        """Pass the request through concurrency, rate limits, quotas and flow control, or raise
        GatewayError. The caller dispatches right away (no await in between) and settles exactly once.
        `ttft_slo`: the request's `x-kvgate-ttft-slo-ms` header (malformed: 400; it only tightens)."""
        name = tenant.name
        try:
            band = request_band(tenant, priority)
        except GatewayError:
            self._m.rejections.labels(name, "bad_priority").inc()
            raise
        try:
            slo = request_slo(tenant, ttft_slo)
        except GatewayError:
            self._m.rejections.labels(name, "bad_slo").inc()
            raise
        if tenant.max_concurrency is not None or tenant.key is not None:
            self._concurrency(tenant)
        self._hold(tenant, 1)  # held from here: concurrent admits cannot all pass
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
                        info.base_model, name, tenant.weight, band, info.reserved_tokens,
                        info.prompt_tokens, slo, info.prefix_keys,
                    )  # fmt: skip
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
                self._hold(tenant, -1)
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
        tenant = admitted.tenant
        name = tenant.name
        self._hold(tenant, -1)
        if admitted.pool is not None and self.admission is not None:
            self.admission.leave(admitted.pool, name)
        c = charge_for(admitted.info, usage, outcome)
        totals = self.totals.get(name)
        if totals is None:
            totals = self.totals[name] = Totals()
        totals.requests += c.requests
        totals.tokens += c.tokens
        if c.tokens:
            counter = self._charged.get(name)
            if counter is None:
                counter = self._charged[name] = self._m.tokens_charged.labels(name)
            counter.inc(c.tokens)
        if self.ledger is not None:
            self.ledger.record(name, tenant.key_label, ledger_model(admitted.info), c)
        if admitted.reservation is not None and self.limiter is not None:
            await self.limiter.settle(admitted.reservation, c.requests, c.tokens)

    # -- views ----------------------------------------------------------------------------------

    def tenants(self) -> tuple[Tenant, ...]:
        reg = self.registry
        extra = (reg.keyless,) if reg.open and reg.keyless is not None else ()
        return reg.tenants + extra

    def find(self, name: str) -> Tenant | None:
        return next((t for t in self.tenants() if t.name == name), None)

    def _collect(self) -> Iterable[Metric]:
        fam = GaugeMetricFamily(
            "kvgate_tenant_in_flight",
            "Admitted requests of each tenant not yet finished (queued or running).",
            labels=["tenant"],
        )
        for name, n in self.in_flight.items():
            fam.add_metric([name], n)
        yield fam
        if self.admission is not None:
            yield from self.admission.collect()
        if self.limiter is not None:
            yield from self.limiter.collect(self.registry.tenants)
