"""The one table of scheduling plugin types, and the builder that turns plain config data into a profile.

A profile spec is plain data (what YAML or JSON gives):

    {"filters": [{"type": "healthy"}, {"type": "kv-full", "params": {"threshold": 0.98}}],
     "scorers": [{"type": "prefix-affinity", "weight": 3.0},
                 {"type": "queue-depth", "weight": 2.0, "name": "q"}],
     "picker": {"type": "max-score"}}

Each entry has a `type` (a key of `PLUGIN_TYPES`), an optional `name` (default: the type; unique within
the profile), optional `params` (the plugin's dataclass fields other than `name`) and, for scorers
only, an optional `weight` (default 1.0, finite and >= 0). `picker` defaults to `max-score`. `None`
counts as absent, so a config model's dump can be passed as is. Every refusal is a ValueError whose
message starts with the offending entry (`scorers[1]`, `picker`, ...); the config loader prefixes the
YAML path.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, cast

from policies.scheduling.contracts import Filter, Picker, Scorer
from policies.scheduling.filters.fresh import FreshFilter
from policies.scheduling.filters.healthy import HealthyFilter
from policies.scheduling.filters.in_flight_cap import InFlightCapFilter
from policies.scheduling.filters.in_service import InServiceFilter
from policies.scheduling.filters.kv_full import KvFullFilter
from policies.scheduling.filters.latency_knee import LatencyKneeFilter
from policies.scheduling.filters.load_guard import LoadGuardFilter
from policies.scheduling.filters.prefix_spread import PrefixSpreadFilter
from policies.scheduling.filters.serves_adapter import ServesAdapterFilter
from policies.scheduling.filters.serves_model import ServesModelFilter
from policies.scheduling.filters.slow_start import SlowStartFilter
from policies.scheduling.pickers.max_score import MaxScorePicker
from policies.scheduling.pickers.near_best import NearBestPicker
from policies.scheduling.pickers.random_order import RandomPicker
from policies.scheduling.pickers.round_robin import RoundRobinPicker
from policies.scheduling.profile import SchedulingProfile, WeightedScorer
from policies.scheduling.scorers.kv_fit import KvFitScorer
from policies.scheduling.scorers.kv_headroom import KvHeadroomScorer
from policies.scheduling.scorers.least_inflight_tokens import LeastInflightTokensScorer
from policies.scheduling.scorers.lora_locality import LoraLocalityScorer
from policies.scheduling.scorers.predicted_latency import PredictedLatencyScorer
from policies.scheduling.scorers.prefix_affinity import PrefixAffinityScorer
from policies.scheduling.scorers.queue_depth import QueueDepthScorer
from policies.scheduling.scorers.session_affinity import SessionAffinityScorer

PluginKind = Literal["filter", "scorer", "picker"]


@dataclass(frozen=True, slots=True)
class PluginType:
    """A registered plugin: its kind and its class (a frozen dataclass whose fields are its params)."""

    kind: PluginKind
    cls: type[Any]


# Typed per kind so mypy checks each class against its contract; PLUGIN_TYPES is the one lookup table.
_FILTERS: dict[str, type[Filter]] = {
    "healthy": HealthyFilter,
    "fresh": FreshFilter,
    "serves-model": ServesModelFilter,
    "serves-adapter": ServesAdapterFilter,
    "kv-full": KvFullFilter,
    "load-guard": LoadGuardFilter,
    "in-service": InServiceFilter,
    "slow-start": SlowStartFilter,
    "in-flight-cap": InFlightCapFilter,
    "latency-knee": LatencyKneeFilter,
    "prefix-spread": PrefixSpreadFilter,
}
_SCORERS: dict[str, type[Scorer]] = {
    "prefix-affinity": PrefixAffinityScorer,
    "queue-depth": QueueDepthScorer,
    "kv-headroom": KvHeadroomScorer,
    "lora-locality": LoraLocalityScorer,
    "session-affinity": SessionAffinityScorer,
    "least-inflight-tokens": LeastInflightTokensScorer,
    "kv-fit": KvFitScorer,
    "predicted-latency": PredictedLatencyScorer,
}
_PICKERS: dict[str, type[Picker]] = {
    "max-score": MaxScorePicker,
    "near-best": NearBestPicker,
    "random": RandomPicker,
    "round-robin": RoundRobinPicker,
}

PLUGIN_TYPES: Mapping[str, PluginType] = MappingProxyType(
    {name: PluginType("filter", cls) for name, cls in _FILTERS.items()}
    | {name: PluginType("scorer", cls) for name, cls in _SCORERS.items()}
    | {name: PluginType("picker", cls) for name, cls in _PICKERS.items()}
)

_SECTIONS = ("filters", "scorers", "picker")
_ENTRY_KEYS = frozenset({"type", "name", "params", "weight"})


def plugin_params(type_name: str) -> dict[str, Any]:
    """The params a plugin type accepts, with their defaults (for docs and error messages)."""
    return {f.name: f.default for f in dataclasses.fields(PLUGIN_TYPES[type_name].cls) if f.name != "name"}


def build_profile(spec: Mapping[str, Any]) -> SchedulingProfile:
    """Build a `SchedulingProfile` from plain data; ValueError naming the entry on any mistake."""
    if not isinstance(spec, Mapping):
        sections = ", ".join(_SECTIONS)
        raise ValueError(f"a profile must be a mapping with {sections}, got {type(spec).__name__}")
    unknown = sorted(str(k) for k in spec if k not in _SECTIONS)
    if unknown:
        raise ValueError(f"unknown profile keys {unknown}; expected {', '.join(_SECTIONS)}")
    seen: dict[str, str] = {}  # plugin name -> entry label
    filters = [
        cast(Filter, _build(f"filters[{i}]", entry, "filter", seen))
        for i, entry in enumerate(_entries(spec, "filters"))
    ]
    scorers = []
    for i, entry in enumerate(_entries(spec, "scorers")):
        label = f"scorers[{i}]"
        scorer = cast(Scorer, _build(label, entry, "scorer", seen))
        scorers.append(WeightedScorer(scorer, _weight(label, entry)))
    picker_entry = spec.get("picker")
    if picker_entry is None:
        picker_entry = {"type": "max-score"}
    picker = cast(Picker, _build("picker", picker_entry, "picker", seen))
    return SchedulingProfile(filters, scorers, picker)


def _entries(spec: Mapping[str, Any], section: str) -> Sequence[Any]:
    entries = spec.get(section)
    if entries is None:
        return ()
    if isinstance(entries, str | bytes) or not isinstance(entries, Sequence):
        raise ValueError(f"{section}: must be a list of plugin entries, got {type(entries).__name__}")
    return entries


def _build(label: str, entry: Any, kind: PluginKind, seen: dict[str, str]) -> object:
    if not isinstance(entry, Mapping):
        raise ValueError(f"{label}: must be a mapping with a 'type', got {type(entry).__name__}")
    extra = sorted(str(k) for k in entry if k not in _ENTRY_KEYS)
    if extra:
        raise ValueError(f"{label}: unknown keys {extra}; entries take type, name, params, weight (scorers)")
    type_name = entry.get("type")
    if not isinstance(type_name, str):
        raise ValueError(f"{label}: 'type' is required and must be a string")
    label = f"{label} (type {type_name!r})"
    plugin_type = PLUGIN_TYPES.get(type_name)
    if plugin_type is None:
        known = ", ".join(n for n, t in PLUGIN_TYPES.items() if t.kind == kind)
        raise ValueError(f"{label}: unknown plugin type; known {kind} types: {known}")
    if plugin_type.kind != kind:
        raise ValueError(f"{label}: is a {plugin_type.kind}, not a {kind}")
    if kind != "scorer" and entry.get("weight") is not None:
        raise ValueError(f"{label}: only scorers take a weight")

    name = entry.get("name")
    if name is None:
        name = type_name
    if not isinstance(name, str) or not name:
        raise ValueError(f"{label}: 'name' must be a non-empty string")
    if name in seen:
        raise ValueError(f"{label}: duplicate plugin name {name!r} (also used by {seen[name]})")
    seen[name] = label

    params = entry.get("params")
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise ValueError(f"{label}: 'params' must be a mapping, got {type(params).__name__}")
    kwargs = _checked_params(label, plugin_type.cls, params)
    try:
        return plugin_type.cls(name=name, **kwargs)
    except ValueError as err:
        raise ValueError(f"{label}: {err}") from None


def _checked_params(label: str, cls: type[Any], params: Mapping[Any, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    accepted = {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name != "name"}
    checked: dict[str, Any] = {}
    for key, value in params.items():
        expected = accepted.get(key) if isinstance(key, str) else None
        if expected is None:
            known = ", ".join(accepted) or "none"
            raise ValueError(f"{label}: unknown param {key!r}; known params: {known}")
        checked[key] = _coerced(f"{label}: param {key!r}", expected, value)
    return checked


def _coerced(label: str, expected: Any, value: Any) -> Any:
    if expected is bool:
        if isinstance(value, bool):
            return value
    elif expected is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if math.isfinite(value):
                return float(value)
            raise ValueError(f"{label}: must be a finite number, got {value!r}")
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif expected is str:
        if isinstance(value, str):
            return value
    else:  # pragma: no cover - every registered plugin uses the scalar types above
        raise TypeError(f"{label}: unsupported param type {expected!r}")
    raise ValueError(f"{label}: must be {expected.__name__}, got {type(value).__name__} {value!r}")


def _weight(label: str, entry: Mapping[str, Any]) -> float:
    weight = entry.get("weight")
    if weight is None:
        return 1.0
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise ValueError(f"{label}: weight must be a number, got {type(weight).__name__}")
    if not math.isfinite(weight) or weight < 0:
        raise ValueError(f"{label}: weight must be finite and >= 0, got {weight}")
    return float(weight)
