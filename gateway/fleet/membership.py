"""What a source of replicas says about one replica (`ReplicaSpec`), and how its phase is decided.

Every way kvgate learns of replicas — the static `replicas:` list, a replicas file, DNS, Kubernetes —
produces a desired set `{name: ReplicaSpec}`; `FleetState.apply` reconciles the live fleet with it.
A spec is a plain frozen value: two specs are equal exactly when nothing about the replica changed.

The phase a replica is in (`policies.types.ReplicaPhase`) is decided by `effective_phase` from what
its source says and what kvgate itself knows:

    departing (left its source, requests still in flight) or drained (admin) or source TERMINATING
                                                                              -> TERMINATING
    source NOT_READY, or `await_model` and `/v1/models` has not listed its model -> NOT_READY
    otherwise                                                                  -> READY
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.config import ReplicaConfig
from policies.types import ReplicaPhase

_NO_LABELS: Mapping[str, str] = MappingProxyType({})

STATIC_SOURCE = "static"


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One replica as its source describes it.

    - `name`: unique in the fleet (metrics label, `x-kvgate-replica`, prefix index key).
    - `url`: base URL (`http(s)://host:port[/prefix]`, as `ReplicaConfig.url`).
    - `model`: the pool (base model). None: learned from the replica's `/v1/models` (its first base
      model); until then the replica is in no pool and NOT_READY.
    - `phase`: what the source says (READY, NOT_READY or TERMINATING).
    - `await_model`: NOT_READY until a `/v1/models` poll lists `model` (discovered replicas: a pod
      is routed only once its model is loaded). Static replicas do not wait.
    - `slow_start_s`: ramp its share over this many seconds after it becomes ready (0: no ramp).
    - `source`: which source produced it (`static`, `file`, `dns`, `kubernetes`).
    - `config`: the `replicas:`-format entry it came from (static list and replicas file), so
      per-replica settings written there travel with it; None for DNS and Kubernetes.
    """

    name: str
    url: str
    model: str | None
    labels: Mapping[str, str] = field(default_factory=lambda: _NO_LABELS)
    phase: ReplicaPhase = ReplicaPhase.READY
    await_model: bool = False
    slow_start_s: float = 0.0
    source: str = STATIC_SOURCE
    config: ReplicaConfig | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a replica needs a name")
        if self.slow_start_s < 0:
            raise ValueError(f"slow_start_s must be >= 0, got {self.slow_start_s}")
        if not isinstance(self.labels, MappingProxyType):
            object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    @classmethod
    def from_config(
        cls,
        config: ReplicaConfig,
        *,
        source: str = STATIC_SOURCE,
        await_model: bool = False,
        slow_start_s: float = 0.0,
    ) -> ReplicaSpec:
        """The spec of a `replicas:` entry (static list or replicas file); always READY."""
        return cls(
            name=config.display_name,
            url=config.url,
            model=config.model,
            labels=config.labels,
            await_model=await_model,
            slow_start_s=slow_start_s,
            source=source,
            config=config,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReplicaSpec):
            return NotImplemented
        return (
            self.name == other.name
            and self.url == other.url
            and self.model == other.model
            and dict(self.labels) == dict(other.labels)
            and self.phase is other.phase
            and self.await_model == other.await_model
            and self.slow_start_s == other.slow_start_s
            and self.source == other.source
            and self.config == other.config
        )

    def __hash__(self) -> int:
        return hash((self.name, self.url, self.model, self.phase, self.source))


def effective_phase(
    source_phase: ReplicaPhase, *, departing: bool, drained: bool, awaiting_model: bool
) -> ReplicaPhase:
    """The replica's phase from its source's word and kvgate's own (see the module doc)."""
    if departing or drained or source_phase is ReplicaPhase.TERMINATING:
        return ReplicaPhase.TERMINATING
    if source_phase is ReplicaPhase.NOT_READY or awaiting_model:
        return ReplicaPhase.NOT_READY
    return ReplicaPhase.READY
