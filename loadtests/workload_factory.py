"""The workload factory: a `WorkloadPlan` (a workload type and its parameters) turned into a seeded
workload sized for a fleet. `kvgate bench` (live and `--des`), `python -m loadtests.des_cli` and the
gateway-count sweep all build their request streams here, so one set of parameters means one stream
whichever driver runs it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from loadtests.workloads import (
    DEFAULT_TENANTS,
    WORKLOAD_TYPES,
    LoraMixWorkload,
    MultiTurnWorkload,
    NoisyNeighbourWorkload,
    RandomWorkload,
    SharedPrefixWorkload,
    Workload,
)


class FleetShape(Protocol):
    """What sizing a workload needs of a fleet (`presets.FleetPlan`, `des.FleetSpec`)."""

    @property
    def replicas(self) -> int: ...

    @property
    def adapters(self) -> tuple[str, ...]: ...

    @property
    def model_name(self) -> str: ...

    @property
    def replica_kv_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class WorkloadPlan:
    """A workload type (`WORKLOAD_TYPES` name) with its parameters (constructor keywords, lengths in
    tokens; how many requests and the model come from the run). For `shared-prefix`, without
    `groups` the group count comes from `size_shared_prefix` at `target_multiple` (default 4) times
    one replica's KV. `policies` restricts which policies run it (empty: all of the run's);
    `warmup_requests` replaces the preset's (e.g. 0 where there is nothing to warm). `label` names
    the workload in results when one type runs twice with other parameters (default: the type)."""

    workload: str
    params: Mapping[str, Any] = field(default_factory=dict)
    policies: tuple[str, ...] = ()
    warmup_requests: int | None = None
    label: str | None = None

    def __post_init__(self) -> None:
        if self.workload not in WORKLOAD_TYPES:
            raise ValueError(f"unknown workload {self.workload!r}; known: {', '.join(WORKLOAD_TYPES)}")

    @property
    def name(self) -> str:
        """The workload's name in results: its label, else its type."""
        return self.label or self.workload


def build_workload(plan: WorkloadPlan, fleet: FleetShape, *, requests: int, seed: int) -> Workload:
    """The workload of `plan` for `fleet`, yielding at least `requests` specs, seeded by `seed`."""
    p = dict(plan.params)
    model = fleet.model_name
    if plan.workload == SharedPrefixWorkload.name:
        target = float(p.pop("target_multiple", 4.0))
        if "groups" in p:
            ppg = max(1, math.ceil(requests / int(p["groups"])))
            return SharedPrefixWorkload(prompts_per_group=ppg, model=model, seed=seed, **p)
        probe = SharedPrefixWorkload.sized(
            replica_kv_tokens=fleet.replica_kv_tokens, replicas=fleet.replicas, prompts_per_group=1,
            model=model, seed=seed, target_multiple=target, **p,
        )  # fmt: skip
        ppg = max(1, math.ceil(requests / probe.groups))
        return SharedPrefixWorkload.sized(
            replica_kv_tokens=fleet.replica_kv_tokens, replicas=fleet.replicas, prompts_per_group=ppg,
            model=model, seed=seed, target_multiple=target, **p,
        )  # fmt: skip
    if plan.workload == RandomWorkload.name:
        return RandomWorkload(requests=requests, model=model, seed=seed, **p)
    if plan.workload == MultiTurnWorkload.name:
        turns = int(p.pop("turns", 4))
        return MultiTurnWorkload(
            conversations=max(1, math.ceil(requests / turns)), turns=turns, model=model, seed=seed, **p
        )
    if plan.workload == LoraMixWorkload.name:
        adapters = list(fleet.adapters) or p.pop("adapters", 4)
        p.pop("adapters", None)
        return LoraMixWorkload(adapters=adapters, requests=requests, base_model=model, seed=seed, **p)
    if plan.workload == NoisyNeighbourWorkload.name:
        return NoisyNeighbourWorkload(requests=requests, model=model, seed=seed, tenants=DEFAULT_TENANTS, **p)
    raise ValueError(f"no builder for workload {plan.workload!r}")  # pragma: no cover - checked in plan
