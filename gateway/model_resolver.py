"""From the `model` a client sent to what serves it: a route's target, a base model, or an adapter.

Runs right after authentication and parsing, before rate limits, flow control and scheduling. The
client's name may be:

- a route (`routes[].name`): one of its targets, by the override header, a sticky key or chance
  (policies/route_choice), and sometimes a mirror as well;
- a base model (a pool), as before;
- an adapter, by its canonical name `base:adapter` or by the name its replicas serve it under.

The answer is a `Resolution`: the canonical target (for allow-lists, metrics and the
`x-kvgate-target` header), the pool and the adapter's served name (what the replica is sent), and
the byte pair that puts the client's name back into the answer's `model` field when it differs.

Cost on the request path: a plain base model or adapter is one dict lookup (the `Resolution` objects
are built ahead, when the fleet's models change); a route is a dict lookup, one xxh3 hash of the
sticky key (or a random draw) and an index into its layout, also ending on a prebuilt object (a
mirror copy costs a `dataclasses.replace` on the sampled requests only).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

import orjson

from gateway.asgi_io import Scope, header
from gateway.config import Config
from gateway.config_routes import known_bases
from gateway.errors import GatewayError
from gateway.fleet.state import FleetChange, FleetState
from gateway.request_parse import ParsedRequest, unknown_model
from gateway.route_table import RouteTable
from policies.model_names import canonical, split_canonical
from policies.route_choice import (
    OverrideNotAllowed,
    UnknownTarget,
    choose_target,
    forced_target,
    mirror_sampled,
    sticky_key,
)

log = logging.getLogger(__name__)
_HOWS = ("sticky", "random", "override", "fallback", "mirror")


@dataclass(frozen=True, slots=True)
class Resolution:
    """What one request resolved to. `requested` is the client's name, `target` the canonical name
    of what serves it, `pool` its base model and `adapter` the adapter's served name (None: the base).
    `route` is the route's name (None: the client named a model). `how`: direct, sticky, random,
    override, fallback (or mirror, for a shadow copy). `upstream_model`: the `model` to send the
    replica when it is not the client's own name. `rewrite`: (the replica's `"model":<name>` bytes,
    the client's), None when the names are equal. `header`: the `x-kvgate-target` value. `mirror`:
    the shadow copy's Resolution when this request is sampled for one."""

    requested: str
    target: str
    pool: str
    adapter: str | None
    route: str | None = None
    how: str = "direct"
    upstream_model: str | None = None
    rewrite: tuple[bytes, bytes] | None = None
    header: bytes = b""
    mirror: Resolution | None = None

    @classmethod
    def build(cls, requested: str, pool: str, adapter: str | None, route: str | None = None,
              how: str = "direct") -> Resolution:  # fmt: skip
        served = adapter if adapter is not None else pool
        target = canonical(pool, adapter)
        differs = served != requested
        return cls(
            requested, target, pool, adapter, route, how,
            served if differs else None,
            (b'"model":' + orjson.dumps(served), b'"model":' + orjson.dumps(requested)) if differs else None,
            target.encode("utf-8"),
        )  # fmt: skip


class ModelResolver:
    """Resolves model names for one Gateway (one event loop). Its maps are rebuilt from the fleet's
    picture when a replica's health or models change (a FleetState listener)."""

    def __init__(self, table: RouteTable, config: Config, fleet: FleetState, rng: random.Random) -> None:
        self._fleet = fleet
        self._rng = rng
        self._direct: dict[str, Resolution] = {}
        self._servable: frozenset[str] = frozenset()
        self._routed: dict[str, dict[tuple[str, str], Resolution]] = {}
        self._mirrors: dict[str, Resolution] = {}
        self._clashes: set[str] = set()  # adapter names like a route's, warned about once
        self.configure(table, config)
        fleet.add_listener(self._on_fleet_change)

    def configure(self, table: RouteTable, config: Config) -> None:
        """Use `table` and `config`'s models from now on (at start, and after a config reload)."""
        self._table = table
        self._bases = known_bases(config)
        self._configured = [(m.name, a) for m in config.models for a in m.adapters]
        self.rebuild_routes()
        self.rebuild()

    # -- the request path -----------------------------------------------------------------------

    def resolve(self, req: ParsedRequest, tenant: str, scope: Scope) -> Resolution:
        """The request's Resolution; GatewayError 404 (unknown model), 403 (the override header from a
        tenant not allowed it) or 400 (the header names no target of the route)."""
        route = self._table.routes.get(req.model)
        if route is None:
            res = self._direct.get(req.model)
            if res is None:
                raise unknown_model(req.model, self.known_names())
            return res
        forced = header(scope, route.override_header) if route.override_header else None
        if forced is not None:
            name = route.override_header.decode("latin-1")
            try:
                target = forced_target(route, tenant, forced.decode("latin-1"))
            except OverrideNotAllowed:
                raise GatewayError(
                    403,
                    f"Tenant '{tenant}' may not choose the target of route `{route.name}`: the `{name}` "
                    "header is reserved to the route's override_tenants.",
                    param=name,
                    code="override_not_allowed",
                ) from None
            except UnknownTarget as err:
                raise GatewayError(400, f"{name}: {err}", param=name) from None
            how = "override"
        else:
            key = None
            if route.sticky_by:
                key = sticky_key(route.sticky_by, _headers(scope), req.body.get("user"),
                                 header(scope, b"authorization"), tenant)  # fmt: skip
            target, how = choose_target(route, tenant, key, self._rng.random())
        res = self._routed[route.name][(target, how)]
        if route.mirror is not None and mirror_sampled(route, self._rng.random()):
            res = replace(res, mirror=self._mirrors[route.name])
        return res

    def servable(self, res: Resolution) -> bool:
        """Whether a healthy replica can serve `res` now (a plain base model is never asked: routing
        answers for it, as before routes existed)."""
        return res.target in self._servable

    def fallback(self, res: Resolution) -> Resolution | None:
        """The route's fallback for a request resolved to `res`, None without one (or for itself)."""
        if res.route is None:
            return None
        route = self._table.routes.get(res.route)
        if route is None or route.fallback is None or route.fallback == res.target:
            return None
        return replace(self._routed[res.route][(route.fallback, "fallback")], mirror=res.mirror)

    def known_names(self) -> list[str]:
        """What `/v1/models` lists and a 404 names: routes, pools, adapters by served name."""
        fm = self._fleet.models()
        return [*self._table.routes, *fm.base_models, *fm.adapters]

    # -- rebuilding -----------------------------------------------------------------------------

    def rebuild_routes(self) -> None:
        """Prebuild every (route, target, how) Resolution (at start and after a reload)."""
        self._routed = {}
        self._mirrors = {}
        for name, route in self._table.routes.items():
            per: dict[tuple[str, str], Resolution] = {}
            for target in (*route.targets(), *((route.mirror,) if route.mirror else ())):
                split = split_canonical(target, self._bases)
                assert split is not None, "targets are checked at config load"
                for how in _HOWS:
                    per[(target, how)] = Resolution.build(name, *split, route=name, how=how)
            self._routed[name] = per
            if route.mirror is not None:
                self._mirrors[name] = per[(route.mirror, "mirror")]

    def rebuild(self) -> None:
        """The direct names and the servable set, from the fleet's picture now."""
        snapshot = self._fleet.snapshot()
        direct: dict[str, Resolution] = {}
        servable: set[str] = set()
        for pool in self._fleet.models().base_models:
            direct[pool] = Resolution.build(pool, pool, None)
        for r in snapshot.replicas:
            if r.healthy:
                servable.add(r.pool)
            for a in sorted(r.adapters):
                self._add_adapter(direct, r.pool, a)
                if r.healthy:
                    servable.add(canonical(r.pool, a))
        for pool, a in self._configured:
            self._add_adapter(direct, pool, a)
        for name in direct.keys() & self._table.routes.keys() - self._clashes:
            self._clashes.add(name)
            log.warning("an adapter is served under the route name %r: requests for it go to the route", name)
        self._direct = direct
        self._servable = frozenset(servable)

    @staticmethod
    def _add_adapter(direct: dict[str, Resolution], pool: str, adapter: str) -> None:
        name = canonical(pool, adapter)
        direct.setdefault(name, Resolution.build(name, pool, adapter))
        direct.setdefault(adapter, Resolution.build(adapter, pool, adapter))  # first pool wins

    def _on_fleet_change(self, _replica: str, change: FleetChange) -> None:
        if change & (FleetChange.HEALTH | FleetChange.MODELS):
            self.rebuild()


def _headers(scope: Scope) -> Callable[[bytes], bytes | None]:
    return lambda name: header(scope, name)
