"""The routes in force: compiled from the config file, with the runtime weight overrides applied.

A `RouteOverride` is a route's weights changed at runtime (`PUT /admin/routes/{name}`): new weights
for the route's own split and/or some tenants' splits, with the layouts that realise them. The
layouts travel with the weights (not recomputed by each gateway) because which buckets move depends
on the layout a change starts from (policies/traffic_split), and every gateway must put every key
on the same target. An override is valid only for the targets it was made for: a gateway whose
config lists other targets for that route ignores it and says so.

`RouteTable` is owned by one Gateway, on one event loop. A change swaps the route's `Route` object
in one assignment: a request resolved before keeps the target it got; the next one sees the change.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.config import Config
from gateway.config_routes import RouteConfig, TargetWeight
from policies.route_choice import Route, StickySource
from policies.tenancy import ModelAllowList
from policies.traffic_split import Split

log = logging.getLogger(__name__)

Weights = tuple[int, ...]


class OverrideError(ValueError):
    """A weight change that cannot be applied; the message is fit for a 400."""


@dataclass(frozen=True, slots=True)
class SplitOverride:
    weights: Weights
    layout: bytes


@dataclass(frozen=True, slots=True)
class RouteOverride:
    """Runtime weights of one route. `targets` are the route's config targets the weights follow
    (the route's own first, then each overridden tenant's); `version` is the store's, for
    compare-and-set; `set_at` is Unix seconds."""

    targets: tuple[str, ...]
    split: SplitOverride | None = None
    tenants: Mapping[str, SplitOverride] = field(default_factory=dict)
    version: int = 0
    set_at: float = 0.0

    def encode(self) -> bytes:
        def enc(s: SplitOverride) -> dict[str, Any]:
            return {"weights": list(s.weights), "layout": base64.b64encode(s.layout).decode()}

        doc: dict[str, Any] = {"targets": list(self.targets), "version": self.version, "set_at": self.set_at}
        if self.split is not None:
            doc["split"] = enc(self.split)
        doc["tenants"] = {t: enc(s) for t, s in self.tenants.items()}
        return orjson.dumps(doc)

    @classmethod
    def decode(cls, raw: bytes) -> RouteOverride:
        """ValueError on anything that is not an encoded override."""
        try:
            doc = orjson.loads(raw)

            def dec(d: Any) -> SplitOverride:
                return SplitOverride(tuple(int(w) for w in d["weights"]), base64.b64decode(d["layout"]))

            return cls(
                targets=tuple(str(t) for t in doc["targets"]),
                split=dec(doc["split"]) if "split" in doc else None,
                tenants={str(t): dec(s) for t, s in doc["tenants"].items()},
                version=int(doc["version"]),
                set_at=float(doc["set_at"]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"not a route override: {err}") from None


def _names(split: tuple[TargetWeight, ...]) -> tuple[str, ...]:
    return tuple(t.model for t in split)


def _fresh(split: tuple[TargetWeight, ...]) -> Split:
    return Split.fresh(_names(split), [t.weight for t in split])


def compile_route(rc: RouteConfig) -> Route:
    """A config route as the request path uses it (the config is already validated)."""
    return Route(
        name=rc.name,
        split=_fresh(rc.targets),
        tenant_splits={t: _fresh(ts) for t, ts in rc.tenant_targets.items()},
        sticky_by=tuple(StickySource.parse(s) for s in rc.sticky_by),
        override_header=rc.override_header.lower().encode("latin-1"),
        override_tenants=frozenset(rc.override_tenants),
        mirror=rc.mirror.model if rc.mirror else None,
        mirror_percent=rc.mirror.percent if rc.mirror else 0.0,
        fallback=rc.fallback,
    )


class RouteTable:
    """Routes by name: `routes` is what requests read (a dict lookup each)."""

    def __init__(self, config: Config) -> None:
        self._config = {r.name: r for r in config.routes}
        self._file = {r.name: compile_route(r) for r in config.routes}
        self._tenants = config.tenants
        self.routes: dict[str, Route] = dict(self._file)
        self.overrides: dict[str, RouteOverride] = {}

    def config_of(self, name: str) -> RouteConfig | None:
        return self._config.get(name)

    def targets_of(self, name: str) -> tuple[str, ...]:
        """The config targets an override of route `name` is made for (see RouteOverride)."""
        rc = self._config[name]
        out = list(_names(rc.targets))
        for t in sorted(rc.tenant_targets):
            out += [f"{t}/{n}" for n in _names(rc.tenant_targets[t])]
        return tuple(out)

    def apply(self, name: str, override: RouteOverride | None) -> bool:
        """Put `override` in force for route `name` (None: back to the file). False, with a warning
        logged, when it does not fit this gateway's config (then the route is left as it was)."""
        base = self._file.get(name)
        if base is None:
            log.warning("route override for %r ignored: no such route in this gateway's config", name)
            return False
        if override is None:
            self.routes[name] = base
            self.overrides.pop(name, None)
            return True
        if override.targets != self.targets_of(name):
            log.warning("route override for %r ignored: made for other targets than this config's", name)
            return False
        try:
            split = base.split if override.split is None else self._with(base.split, override.split)
            tenants = dict(base.tenant_splits)
            for t, so in override.tenants.items():
                if t not in tenants:
                    raise ValueError(f"no tenant split for {t!r}")
                tenants[t] = self._with(tenants[t], so)
        except ValueError as err:
            log.warning("route override for %r ignored: %s", name, err)
            return False
        self.routes[name] = base.with_splits(split, tenants)
        self.overrides[name] = override
        return True

    @staticmethod
    def _with(split: Split, so: SplitOverride) -> Split:
        return split.with_layout(so.weights, so.layout)

    def propose(self, name: str, body: Any, current: RouteOverride | None) -> RouteOverride:
        """The override a `PUT /admin/routes/{name}` body asks for, moved from `current` (the override
        in force in the store, or None for the file's weights). Body: `{"weights": {target: w, ...},
        "tenant_weights": {tenant: {target: w, ...}}}`, either key optional, each split given whole.
        Splits the body does not name keep their current weights. OverrideError says what is wrong."""
        if not isinstance(body, dict) or not body.keys() <= {"weights", "tenant_weights"} or not body:
            raise OverrideError("expected an object with 'weights' and/or 'tenant_weights'")
        base = self._file[name]
        now_split = base.split if current is None or current.split is None else (
            self._with(base.split, current.split))  # fmt: skip
        split_o = current.split if current is not None else None
        tenants_o = dict(current.tenants) if current is not None else {}
        if "weights" in body:
            split_o = self._reweigh(now_split, body["weights"], "weights")
        tw = body.get("tenant_weights", {})
        if not isinstance(tw, dict):
            raise OverrideError("'tenant_weights' must be an object of tenant -> weights")
        for tenant, weights in tw.items():
            own = base.tenant_splits.get(tenant)
            if own is None:
                raise OverrideError(f"route {name!r} has no tenant_targets for {tenant!r}")
            if tenant in tenants_o:
                own = self._with(own, tenants_o[tenant])
            tenants_o[tenant] = self._reweigh(own, weights, f"tenant_weights.{tenant}")
        proposal = RouteOverride(self.targets_of(name), split_o, tenants_o, set_at=time.time())
        self._check_allow_lists(name, proposal)
        return proposal

    @staticmethod
    def _reweigh(split: Split, weights: Any, at: str) -> SplitOverride:
        if not isinstance(weights, dict):
            raise OverrideError(f"'{at}' must be an object of target -> integer weight")
        unknown = [t for t in weights if t not in split.targets]
        missing = [t for t in split.targets if t not in weights]
        if unknown or missing:
            raise OverrideError(
                f"'{at}' must give a weight to each of the split's targets ({', '.join(split.targets)})"
                + (f"; unknown: {', '.join(map(str, unknown))}" if unknown else "")
                + (f"; missing: {', '.join(missing)}" if missing else "")
            )
        ws = [weights[t] for t in split.targets]
        if any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in ws) or sum(ws) <= 0:
            raise OverrideError(f"'{at}': weights must be integers >= 0 with a positive sum")
        new = split.reweighted(ws)
        return SplitOverride(new.weights, new.layout)

    def _check_allow_lists(self, name: str, proposal: RouteOverride) -> None:
        """The load-time rule (gateway/config_routes) for the weights proposed: a tenant allowed the
        route must be allowed every target with weight in its split."""
        rc = self._config[name]
        for t in self._tenants:
            if t.models is None:
                continue
            allow = ModelAllowList.compile(t.models)
            if not allow.allows(name):
                continue
            if t.name in rc.tenant_targets:
                names, so = _names(rc.tenant_targets[t.name]), proposal.tenants.get(t.name)
            else:
                names, so = _names(rc.targets), proposal.split
            if so is None:
                continue
            refused = [n for n, w in zip(names, so.weights, strict=True) if w > 0 and not allow.allows(n)]
            if refused:
                raise OverrideError(
                    f"tenant {t.name!r} may use route {name!r} but not {', '.join(refused)}: "
                    "it would be refused on that share of its requests"
                )

    def view(self, name: str) -> dict[str, Any]:
        """What `/admin/routes` shows of one route's split (weights and buckets per target)."""
        route = self.routes[name]
        file_route = self._file[name]
        override = self.overrides.get(name)

        def split_view(s: Split, f: Split) -> dict[str, Any]:
            return {
                "weights": dict(zip(s.targets, s.weights, strict=True)),
                "file_weights": dict(zip(f.targets, f.weights, strict=True)),
                "buckets": dict(zip(s.targets, s.counts(), strict=True)),
            }

        return {
            "name": name,
            "override": None
            if override is None
            else {"version": override.version, "set_at": override.set_at},
            "split": split_view(route.split, file_route.split),
            "tenant_splits": {
                t: split_view(s, file_route.tenant_splits[t]) for t, s in route.tenant_splits.items()
            },
            "sticky_by": list(self._config[name].sticky_by),
            "override_header": route.override_header.decode("latin-1"),
            "override_tenants": sorted(route.override_tenants),
            "mirror": None
            if route.mirror is None
            else {"model": route.mirror, "percent": route.mirror_percent},
            "fallback": route.fallback,
        }
