"""The `routes:` section (A/B routing of models and adapters) and its checks against the rest.

    routes:
      - name: chat                                  # what clients send as "model"
        targets:                                    # a base model or "base:adapter"; integer weights
          - {model: llama-3-8b, weight: 90}
          - {model: "llama-3-8b:chat-v2", weight: 10}
        sticky_by: [header:x-session-id, user, api_key]   # first present wins; none: per request
        override_header: x-kvgate-force-target
        override_tenants: [qa]
        tenant_targets: {acme: [{model: llama-3-8b, weight: 50}, {model: "llama-3-8b:chat-v2", weight: 50}]}
        mirror: {model: "llama-3-8b:chat-v3", percent: 5}  # shadow copy, answer discarded
        fallback: llama-3-8b                        # when no healthy replica can serve the drawn arm

`route_problems` runs from `Config`'s own validator (it needs the models, replicas and tenants):
every target names a known base model or `base:adapter` with a known base; weights have a positive
sum; no route is named like a base model or an adapter; and a tenant whose allow-list admits a route
admits every target that route may serve it (else that tenant would be refused on a share of its
requests at random).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field

from policies.model_names import SEPARATOR, split_canonical
from policies.route_choice import DEFAULT_OVERRIDE_HEADER, StickySource
from policies.tenancy import ModelAllowList
from policies.traffic_split import MAX_TARGETS

if TYPE_CHECKING:
    from gateway.config import Config

_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an HTTP token


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TargetWeight(_Strict):
    model: str = Field(min_length=1)  # canonical: a base model or "base:adapter"
    weight: Annotated[int, Field(ge=0, strict=True)]


class MirrorConfig(_Strict):
    model: str = Field(min_length=1)
    percent: float = Field(ge=0, le=100, allow_inf_nan=False)  # of the route's requests, sampled
    max_in_flight: int = Field(8, ge=1)  # shadow requests at once for this route; more are dropped


class RouteConfig(_Strict):
    # Letters, digits and . _ - /, no ":" (that is how an adapter's canonical name is written).
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-/]+$")
    targets: tuple[TargetWeight, ...] = Field(min_length=1, max_length=MAX_TARGETS)
    sticky_by: tuple[str, ...] = ()
    override_header: str = DEFAULT_OVERRIDE_HEADER
    override_tenants: tuple[str, ...] = ()
    tenant_targets: dict[str, tuple[TargetWeight, ...]] = Field(default_factory=dict)
    mirror: MirrorConfig | None = None
    fallback: str | None = None


def check_adapter_sources(adapters: dict[str, str]) -> dict[str, str]:
    """`models[].adapters`: served name -> source path, both non-empty, names without ':'."""
    for name, path in adapters.items():
        if not name or SEPARATOR in name:
            raise ValueError(f"adapter name {name!r}: must be non-empty and without {SEPARATOR!r}")
        if not path:
            raise ValueError(f"adapter {name!r}: the source path is empty")
    return adapters


def known_bases(config: Config) -> set[str]:
    """Base models the config knows: `models[].name`, the replicas' pools, `simulator.model`."""
    bases = {m.name for m in config.models} | {r.model for r in config.replicas}
    if config.simulator.model:
        bases.add(config.simulator.model)
    return bases


def route_problems(config: Config) -> list[str]:
    """Each problem with `config.routes` as `routes[i].field: reason` (empty: none)."""
    bases = known_bases(config)
    adapter_names = {a for m in config.models for a in m.adapters}
    problems: list[str] = []
    seen: set[str] = set()
    for i, r in enumerate(config.routes):
        at = f"routes[{i}]"
        if r.name in seen:
            problems.append(f"{at}.name: another route is named {r.name!r}")
        seen.add(r.name)
        if r.name in bases:
            problems.append(f"{at}.name: {r.name!r} is a base model; a route needs a name of its own")
        if r.name in adapter_names:
            problems.append(f"{at}.name: {r.name!r} is an adapter's name; a route needs a name of its own")
        splits = {"targets": r.targets, **{f"tenant_targets.{t}": ts for t, ts in r.tenant_targets.items()}}
        for where, split in splits.items():
            problems += _split_problems(f"{at}.{where}", split, bases)
        for where, name in (("mirror.model", r.mirror.model if r.mirror else None), ("fallback", r.fallback)):
            if name is not None and split_canonical(name, bases) is None:
                problems.append(f"{at}.{where}: {_unknown(name)}")
        for j, spec in enumerate(r.sticky_by):
            try:
                StickySource.parse(spec)
            except ValueError as err:
                problems.append(f"{at}.sticky_by[{j}]: {err}")
        if not _HEADER_NAME.match(r.override_header):
            problems.append(f"{at}.override_header: {r.override_header!r} is not a header name")
    problems += _allow_list_problems(config)
    return problems


def _split_problems(at: str, split: tuple[TargetWeight, ...], bases: set[str]) -> list[str]:
    problems = []
    if not split:
        problems.append(f"{at}: a split needs at least one target")
    names = [t.model for t in split]
    for j, t in enumerate(split):
        if split_canonical(t.model, bases) is None:
            problems.append(f"{at}[{j}].model: {_unknown(t.model)}")
        if names.index(t.model) != j:
            problems.append(f"{at}[{j}].model: {t.model!r} is listed twice")
    if split and sum(t.weight for t in split) <= 0:
        problems.append(f"{at}: the weights must have a positive sum")
    if len(split) > MAX_TARGETS:
        problems.append(f"{at}: at most {MAX_TARGETS} targets")
    return problems


def _unknown(name: str) -> str:
    return (
        f"{name!r} is not a configured base model or 'base{SEPARATOR}adapter' of one "
        "(list the base in models: or replicas:)"
    )


def _allow_list_problems(config: Config) -> list[str]:
    problems = []
    for i, t in enumerate(config.tenants):
        if t.models is None:
            continue
        allow = ModelAllowList.compile(t.models)
        for r in config.routes:
            if not allow.allows(r.name):
                continue
            split = r.tenant_targets.get(t.name, r.targets)
            names = [x.model for x in split if x.weight > 0] + ([r.fallback] if r.fallback else [])
            refused = [n for n in names if not allow.allows(n)]
            if refused:
                problems.append(
                    f"tenants[{i}].models: allows route {r.name!r} but not its target(s) "
                    f"{', '.join(map(repr, refused))}, so it would be refused on their share of requests"
                )
    return problems
