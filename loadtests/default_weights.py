"""Variants of the built-in `default` profile that the `weights` bench preset compares, and the one the
measurements chose (docs/benchmarks.md, "Choosing the default weights")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from policies.scheduling.builtin_profiles import builtin_profile_spec


@dataclass(frozen=True, slots=True)
class DefaultWeights:
    """A variant of the built-in `default` profile: the prefix-affinity, queue-depth and kv-headroom
    weights; the load-guard's slack (`guard` = (abs_slack requests, rel_slack fraction of the least
    load), None drops the guard); the kv-full filter's threshold (KV usage fraction, None drops it).
    The other filters and scorers are those of the built-in default."""

    prefix: float
    queue: float
    kv: float
    guard: tuple[float, float] | None = (8.0, 0.5)
    kv_full: float | None = 0.98

    @property
    def name(self) -> str:
        guard = "noguard" if self.guard is None else f"g{self.guard[0]:g}-{self.guard[1]:g}"
        full = "nofull" if self.kv_full is None else f"f{self.kv_full:g}"
        return f"p{self.prefix:g}-q{self.queue:g}-k{self.kv:g}-{guard}-{full}"

    def spec(self) -> dict[str, Any]:
        """The profile spec (config `scheduling.profiles` form): the built-ins' membership and hard
        filters, `fresh`, then kv-full and load-guard as set; the three weighted scorers (a zero
        weight leaves the scorer out), then lora-locality and session-affinity at weight 1; the
        built-in default's picker (`max-score` when the weights were chosen, `near-best` since:
        docs/benchmarks.md, "Hit rate and goodput vs number of gateways")."""
        filters: list[dict[str, Any]] = [
            {"type": "in-service"}, {"type": "healthy"}, {"type": "serves-model"}, {"type": "serves-adapter"},
            {"type": "slow-start"}, {"type": "in-flight-cap"}, {"type": "latency-knee"}, {"type": "fresh"},
        ]  # fmt: skip
        if self.kv_full is not None:
            filters.append({"type": "kv-full", "params": {"threshold": float(self.kv_full)}})
        if self.guard is not None:
            filters.append(
                {
                    "type": "load-guard",
                    "params": {"abs_slack": float(self.guard[0]), "rel_slack": float(self.guard[1])},
                }
            )
        weighted = (("prefix-affinity", self.prefix), ("queue-depth", self.queue), ("kv-headroom", self.kv))
        scorers = [{"type": t, "weight": float(w)} for t, w in weighted if w]
        scorers += [{"type": "lora-locality", "weight": 1.0}, {"type": "session-affinity", "weight": 1.0}]
        return {"filters": filters, "scorers": scorers, "picker": builtin_profile_spec("default")["picker"]}


# Candidate variants of the default profile, compared by the `weights` preset (docs/benchmarks.md,
# "Choosing the default weights", has the measurement and the command). The first is the
# provisional profile kvgate shipped with before the measurements; `CHOSEN_DEFAULT` is the built-in
# `default` now.
WEIGHT_CANDIDATES: tuple[DefaultWeights, ...] = (
    DefaultWeights(3, 2, 1, (8, 0.5), 0.98),
    DefaultWeights(3, 2, 1, (16, 1.0), 0.98),
    DefaultWeights(3, 2, 0, (16, 1.0), 0.98),
    DefaultWeights(3, 2, 1, (16, 1.0), None),
    DefaultWeights(3, 2, 0, (16, 1.0), None),
    DefaultWeights(3, 2, 0, (8, 0.5), None),
)
CHOSEN_DEFAULT = DefaultWeights(3, 2, 0, (16, 1.0), None)
"""The candidate the measurements chose; the built-in `default` profile is its spec."""
CANDIDATE_PROFILES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {c.name: c.spec() for c in WEIGHT_CANDIDATES}
)
