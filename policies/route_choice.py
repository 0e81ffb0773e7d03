"""Which target serves one request for a route: the override header, else a sticky key, else chance.

A route is a client-facing model name that kvgate resolves to one of its targets (a base model or an
adapter, by canonical name) before anything else looks at the request:

1. the override header, when present: only tenants in `override_tenants` may send it
   (`OverrideNotAllowed` otherwise, whatever its value), and its value must name one of the route's
   targets (`UnknownTarget`);
2. else the first sticky source that the request carries (`sticky_by`, in order: a header, the
   body's `user`, the API key, the tenant) hashed with the route's name into a bucket of the
   tenant's split (`tenant_targets`) or of the route's;
3. else a bucket drawn at random (per request, no stickiness).

A sampled share of requests (`mirror_percent`) is also copied to the mirror target.

Pure: the caller passes the header lookup, the body's `user`, the key and the random draws.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from policies.traffic_split import Split, bucket_of, bucket_of_draw, route_key

StickyKind = Literal["header", "user", "api_key", "tenant"]
How = Literal["override", "sticky", "random"]
DEFAULT_OVERRIDE_HEADER = "x-kvgate-force-target"


class OverrideNotAllowed(Exception):
    """The tenant sent the override header but is not in the route's `override_tenants`."""


class UnknownTarget(ValueError):
    """The override header names no target of the route; the message lists the ones it may name."""


@dataclass(frozen=True, slots=True)
class StickySource:
    """One `sticky_by` entry: `header:<name>` (the header, lower-cased), `user`, `api_key`, `tenant`."""

    kind: StickyKind
    header: bytes = b""

    @classmethod
    def parse(cls, spec: str) -> StickySource:
        """ValueError with a message fit for a config error when `spec` is none of the four forms."""
        if spec in ("user", "api_key", "tenant"):
            return cls(spec)  # type: ignore[arg-type]
        name = spec.removeprefix("header:")
        if name != spec and name.strip() and name == name.strip() and ":" not in name:
            return cls("header", name.lower().encode("latin-1"))
        raise ValueError(f"{spec!r}: expected 'header:<name>', 'user', 'api_key' or 'tenant'")


@dataclass(frozen=True, slots=True)
class Route:
    """A compiled route. `split` is everyone's split, `tenant_splits` the tenants' own; `prefix` is the
    route's part of every sticky hash (`route_key(name)`). Immutable: a weight change builds a new
    Route (`with_splits`), so a request keeps the one it started with."""

    name: str
    split: Split
    tenant_splits: Mapping[str, Split] = field(default_factory=dict)
    sticky_by: tuple[StickySource, ...] = ()
    override_header: bytes = DEFAULT_OVERRIDE_HEADER.encode()
    override_tenants: frozenset[str] = frozenset()
    mirror: str | None = None
    mirror_percent: float = 0.0
    fallback: str | None = None
    prefix: bytes = b""

    def __post_init__(self) -> None:
        if not self.prefix:
            object.__setattr__(self, "prefix", route_key(self.name))
        if not 0.0 <= self.mirror_percent <= 100.0:
            raise ValueError(f"mirror percent must be in [0, 100], got {self.mirror_percent}")

    def split_for(self, tenant: str) -> Split:
        return self.tenant_splits.get(tenant, self.split)

    def targets(self) -> tuple[str, ...]:
        """Every target a request for this route may be served by: the splits' targets, then the
        fallback (config order, each once). The mirror is not one: its answers reach no client."""
        names = [*self.split.targets]
        for s in self.tenant_splits.values():
            names += s.targets
        if self.fallback is not None:
            names.append(self.fallback)
        return tuple(dict.fromkeys(names))

    def with_splits(self, split: Split, tenant_splits: Mapping[str, Split]) -> Route:
        return Route(
            self.name, split, dict(tenant_splits), self.sticky_by, self.override_header,
            self.override_tenants, self.mirror, self.mirror_percent, self.fallback, self.prefix,
        )  # fmt: skip


def sticky_key(
    sources: Sequence[StickySource],
    header: Callable[[bytes], bytes | None],
    user: object,
    api_key: bytes | None,
    tenant: str,
) -> bytes | None:
    """The first non-empty key among `sources`, or None. `header(name)` looks a request header up;
    `user` is the body's `user` field (only a non-empty string counts)."""
    for s in sources:
        if s.kind == "header":
            value = header(s.header)
            if value:
                return value
        elif s.kind == "user":
            if isinstance(user, str) and user:
                return user.encode("utf-8", "surrogatepass")
        elif s.kind == "api_key":
            if api_key:
                return api_key
        elif tenant:
            return tenant.encode("utf-8")
    return None


def choose_target(route: Route, tenant: str, key: bytes | None, draw: float) -> tuple[str, How]:
    """The target of a request without the override header: by its sticky `key` when it has one,
    else by `draw` (uniform in [0, 1))."""
    split = route.split_for(tenant)
    if key is not None:
        return split.target(bucket_of(route.prefix, key)), "sticky"
    return split.target(bucket_of_draw(draw)), "random"


def forced_target(route: Route, tenant: str, value: str) -> str:
    """The target the override header names. OverrideNotAllowed when `tenant` may not use it (checked
    first: its value tells nothing to a tenant that may not send it), UnknownTarget when the value
    is not one of `route.targets()` or the mirror."""
    if tenant not in route.override_tenants:
        raise OverrideNotAllowed(tenant)
    allowed = route.targets() + ((route.mirror,) if route.mirror is not None else ())
    if value not in allowed:
        raise UnknownTarget(f"{value!r} is not a target of route {route.name!r}; expected one of: "
                            + ", ".join(allowed))  # fmt: skip
    return value


def mirror_sampled(route: Route, draw: float) -> bool:
    """Whether this request is also copied to the mirror (`draw` uniform in [0, 1))."""
    return route.mirror is not None and draw * 100.0 < route.mirror_percent
