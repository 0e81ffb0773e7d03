"""A/B routing of models and adapters: the one object the proxy, the admin API and the Gateway hold.

It puts together the route table and its runtime overrides (gateway/route_table, route_overrides),
name resolution (gateway/model_resolver), adapter placement (gateway/adapter_loader), shadow copies
(gateway/shadow) and the per-variant metrics (gateway/route_metrics). Request path, in order:

1. `resolve(req, tenant, scope)` right after authentication and parsing: the `Resolution` (404, 403
   for the override header, 400);
2. `ready(res)`: False only when a route's target or an adapter has no healthy replica now; then
   `await place(res)`: load the adapter and wait for it (bounded), or switch to the route's
   fallback, or answer 503 with Retry-After;
3. once the primary's answer has started: `launch_mirror(...)` for a request sampled for a copy;
4. `done(res, ...)` when the request ended, whatever happened (it ends what `resolve` began).

Owned by one Gateway, one event loop; built in its constructor, started with its upstream pool.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from gateway.adapter_loader import AdapterLoader, AdapterLoadFailed
from gateway.admission import AdmissionQueue
from gateway.asgi_io import Scope
from gateway.config import Config
from gateway.errors import GatewayError
from gateway.fleet.state import FleetState
from gateway.forwarder import Forwarder, Outcome
from gateway.metrics import GatewayMetrics
from gateway.model_resolver import ModelResolver, Resolution
from gateway.reload import ReloadStep
from gateway.replica_auth import ReplicaCredentials
from gateway.request_parse import ParsedRequest
from gateway.route_metrics import RouteMetrics
from gateway.route_overrides import (
    MemoryOverrideStore,
    OverrideConflict,
    OverrideStore,
    OverrideStoreUnavailable,
    RedisOverrideStore,
)
from gateway.route_table import OverrideError, RouteOverride, RouteTable
from gateway.routing import Router
from gateway.shadow import ShadowSender
from gateway.upstream import UpstreamPool
from policies.types import RequestInfo

log = logging.getLogger(__name__)

_CAS_ATTEMPTS = 3


def _mirror_limits(config: Config) -> dict[str, int]:
    return {r.name: r.mirror.max_in_flight for r in config.routes if r.mirror is not None}


class ModelRoutes:
    def __init__(
        self,
        config: Config,
        fleet: FleetState,
        router: Router,
        metrics: GatewayMetrics,
        rng: random.Random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = RouteTable(config)
        self.metrics = RouteMetrics(metrics)
        self._redis: Any = None
        self.store: OverrideStore = MemoryOverrideStore()
        if config.state.store != "memory://":
            redis_store = RedisOverrideStore.from_url(config.state.store, config.state.key_prefix)
            self._redis, self.store = redis_store.client, redis_store
        self.loader = AdapterLoader(config, fleet, self.metrics, self._redis, config.state.key_prefix, clock)
        self.resolver = ModelResolver(self.table, config, fleet, rng)
        self.shadow = ShadowSender(
            fleet, router, self.metrics, _mirror_limits(config), self.resolver.servable,
            self.loader.start_load, clock, engine_priority=config.flow_control.pass_priority,
        )  # fmt: skip
        self._retry_after = str(config.flow_control.retry_after_fallback_s).encode()

    async def start(
        self,
        pool: UpstreamPool,
        forwarder: Forwarder,
        admission: AdmissionQueue | None,
        credentials: ReplicaCredentials | None = None,
    ) -> None:
        self.loader.bind(pool, credentials)
        self.shadow.bind(forwarder, admission)
        await self.store.start(list(self.table.routes), self._on_override)

    async def stop(self) -> None:
        await self.shadow.stop()
        await self.loader.stop()
        await self.store.stop()

    # -- the request path -----------------------------------------------------------------------

    def resolve(self, req: ParsedRequest, tenant: str, scope: Scope) -> Resolution:
        """See ModelResolver.resolve. A routed request is counted in flight for its arm until `done`."""
        res = self.resolver.resolve(req, tenant, scope)
        if res.route is not None:
            self.metrics.begin(res.route, res.target)
        return res

    def ready(self, res: Resolution) -> bool:
        """Nothing to wait for: a plain base model (routing answers for it), or a target that a
        healthy replica serves now."""
        return (res.route is None and res.adapter is None) or self.resolver.servable(res)

    async def place(self, res: Resolution) -> Resolution:
        """What serves a request whose target is not `ready`: the same target once its adapter is
        loaded (waiting up to the pool's `adapter_load_timeout_s`), else the route's fallback when a
        healthy replica serves it, else `res` unchanged (routing then answers 503). A load that fails
        or times out without a fallback is a 503 with Retry-After."""
        new = await self._place(res)
        if new is not res and res.route is not None:
            self.metrics.end(res.route, res.target)
            self.metrics.begin(res.route, new.target)
        return new

    async def _place(self, res: Resolution) -> Resolution:
        loader = self.loader
        if res.adapter is not None and loader.can_load(res.pool, res.adapter):
            try:
                await loader.ensure(res.pool, res.adapter)
                return res
            except (TimeoutError, AdapterLoadFailed) as err:
                fallback = self._usable_fallback(res)
                if fallback is not None:
                    return fallback
                timed_out = isinstance(err, TimeoutError)
                detail = (
                    f"is being loaded onto a replica and was not ready within {loader.timeout_s(res.pool):g}s"
                    if timed_out else "could not be loaded onto any replica"
                )  # fmt: skip
                raise GatewayError(
                    503,
                    f"The adapter `{res.target}` {detail}. Please try again shortly.",
                    code="adapter_not_loaded",
                    headers=((b"retry-after", self._retry_after),),
                ) from None
        fallback = self._usable_fallback(res)
        return res if fallback is None else fallback

    def _usable_fallback(self, res: Resolution) -> Resolution | None:
        fallback = self.resolver.fallback(res)
        return fallback if fallback is not None and self.resolver.servable(fallback) else None

    def itl_observer(self, res: Resolution, also: Callable[[float], None]) -> Callable[[float], None]:
        """The forwarder's per-gap hook: the model's histogram, and the arm's for a routed request."""
        if res.route is None:
            return also
        return self.metrics.itl_observer(res.route, res.target, also)

    def dispatched(self, res: Resolution, replica: str) -> None:
        if res.adapter is not None:
            self.loader.dispatched(replica, res.adapter)

    def finished(self, res: Resolution, replica: str) -> None:
        if res.adapter is not None:
            self.loader.finished(replica, res.adapter)

    def launch_mirror(
        self, res: Resolution, endpoint: str, path: str, body: bytes, info: RequestInfo
    ) -> None:
        if res.mirror is not None:
            self.shadow.launch(res.mirror, endpoint, path, body, info)

    def done(self, res: Resolution, status: int, t0: float, out: Outcome) -> None:
        if res.route is not None:
            self.metrics.done(res.route, res.target, False, status, t0, out)

    # -- admin ----------------------------------------------------------------------------------

    def names(self) -> list[str]:
        return list(self.table.routes)

    def view(self, name: str) -> dict[str, Any]:
        out = self.table.view(name)
        out["shared"] = self.store.shared
        out["arms"] = self.metrics.summary(name)
        return out

    async def set_weights(self, name: str, body: Any) -> dict[str, Any]:
        """Apply a `PUT /admin/routes/{name}` body (see RouteTable.propose) through the store, so that
        every gateway applies it. OverrideError (400), OverrideStoreUnavailable (503),
        OverrideConflict (409: changed concurrently three times over)."""
        for _ in range(_CAS_ATTEMPTS):
            current, version = await self.store.read(name)
            proposal = self.table.propose(name, body, current)
            try:
                stored = await self.store.write(name, proposal, version)
            except OverrideConflict:
                continue
            log.info(
                "route %s: runtime weights set (version %d): %s", name, stored.version, _describe(stored)
            )
            return self.view(name)
        raise OverrideConflict(name)

    async def clear_weights(self, name: str) -> dict[str, Any]:
        await self.store.clear(name)
        log.info("route %s: runtime weights dropped, the file's weights are in force", name)
        return self.view(name)

    def _on_override(self, name: str, override: RouteOverride | None) -> None:
        if self.table.apply(name, override) and override is not None:
            log.info("route %s: runtime weights in force (version %d)", name, override.version)

    # -- operations -----------------------------------------------------------------------------

    def prepare(self, old: Config, new: Config) -> ReloadStep:
        """A config reload (gateway/reload.py): routes go back to the file — new weights, and every
        runtime override dropped, in the shared store too so that every gateway converges — and that
        is logged. The table is built here (the config was validated in full already); the swap is the
        commit; dropping the shared overrides is the settle."""
        table = RouteTable(new)
        dropped = sorted(self.table.overrides)

        def commit() -> None:
            self.table = table
            self.resolver.configure(table, new)
            self.shadow.set_limits(_mirror_limits(new))
            self.loader.configure(new)
            self.store.follow(list(table.routes))

        async def settle() -> None:
            for name in dropped:
                if name in table.routes:
                    try:
                        await self.store.clear(name)
                    except OverrideStoreUnavailable as err:
                        log.warning("config reload: could not drop the shared override of %s: %s", name, err)
            log.warning(
                "config reload: routes reset to the file%s",
                f" (runtime weights dropped: {', '.join(dropped)})"
                if dropped
                else " (no runtime weights were set)",
            )

        return ReloadStep(commit, settle)

    async def reload(self, config: Config) -> None:
        """`prepare`, commit and settle in one call (for callers outside a Gateway reload)."""
        step = self.prepare(config, config)
        step.commit()
        if step.settle is not None:
            await step.settle()


def _describe(o: RouteOverride) -> str:
    parts = []
    if o.split is not None:
        parts.append("weights " + "/".join(map(str, o.split.weights)))
    parts += [f"{t}: " + "/".join(map(str, s.weights)) for t, s in o.tenants.items()]
    return ", ".join(parts)


__all__ = ["ModelRoutes", "OverrideConflict", "OverrideError", "OverrideStoreUnavailable", "Resolution"]
