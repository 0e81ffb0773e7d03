"""Simulated replicas for the discrete-event run: the simulator's `Engine`, driven as its HTTP driver does.

One `SimReplica` is one replica: an `Engine` (the same engine model the real-time simulator serves)
plus what `simulator.server.driver.EngineDriver` adds around it, minus the wall clock:

- requests that arrive while a step runs wait in `pending` and join the engine at the next step
  boundary, with their own arrival time (so a scrape during a step sees them in neither the running
  nor the waiting count, exactly as `/metrics` of a live replica does);
- a step started at `now` runs `engine.step(now)` at once (the engine is a pure function of its calls),
  and its tokens and finishes take effect at `result.end`, when the run's STEP_END event fires; the
  next step starts at that same instant, before any client can react to the tokens (the live driver
  starts its next step before its handlers write the chunks);
- an idle replica (nothing the engine can run) starts a step as soon as a request arrives.

Times are virtual seconds. Owned by one run; not thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.engine import Engine, EngineConfig, EngineRequest, StepResult
from simulator.profiles import Profile, get_profile


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """`replicas` identical replicas of `profile`, each an engine with `engine` arguments.

    `model` is the served base model name (None = the profile's); `adapters` are LoRA adapters every
    replica lists (they need `engine.max_loras` >= 1). Replica i is named `r<i>`.
    """

    replicas: int
    profile: str = "llama-3-8b-h100"
    engine: EngineConfig = field(default_factory=EngineConfig)
    model: str | None = None
    adapters: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.adapters and self.engine.max_loras < 1:
            raise ValueError("adapters need engine.max_loras >= 1")
        get_profile(self.profile)  # ValueError naming the known profiles

    @property
    def model_profile(self) -> Profile:
        return get_profile(self.profile)

    @property
    def model_name(self) -> str:
        return self.model or self.model_profile.model_name

    @property
    def replica_kv_tokens(self) -> int:
        """One replica's KV capacity in tokens (`engine.num_gpu_blocks`, else what the profile holds)."""
        blocks = self.engine.num_gpu_blocks or self.model_profile.num_gpu_blocks(self.engine.block_size)
        return blocks * self.engine.block_size

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f"r{i}" for i in range(self.replicas))


class SimReplica:
    """One simulated replica (see the module docstring).

    `step` is the step in flight (None while idle); `routed` counts requests sent to it.
    """

    __slots__ = ("engine", "index", "name", "pending", "routed", "step")

    def __init__(self, index: int, name: str, engine: Engine) -> None:
        self.index = index
        self.name = name
        self.engine = engine
        self.pending: list[tuple[EngineRequest, float]] = []
        self.step: StepResult | None = None
        self.routed = 0

    @property
    def busy(self) -> bool:
        return self.step is not None

    def submit(self, request: EngineRequest, now: float) -> bool:
        """Hand `request` (arrived at `now`) to the replica. True when the replica is idle and the
        caller must start a step now (`start_step`)."""
        self.pending.append((request, now))
        self.routed += 1
        return self.step is None

    def start_step(self, now: float) -> StepResult | None:
        """Admit what is pending and run one engine step from `now`. Returns the step (its tokens are
        due at `result.end`) or None when the engine has nothing it can run: the replica is then idle
        until the next `submit`."""
        engine = self.engine
        if self.pending:
            for request, arrival in self.pending:
                engine.add_request(request, arrival if arrival < now else now)
            self.pending.clear()
        if not engine.has_unfinished():
            self.step = None
            return None
        result = engine.step(now)
        if result.duration <= 0.0:
            self.step = None
            return None
        self.step = result
        return result

    def abort(self, request_id: str, now: float) -> bool:
        """Finish `request_id` from outside (the client left), pending or in the engine. True if it
        was still there."""
        for i, (request, _) in enumerate(self.pending):
            if request.request_id == request_id:
                del self.pending[i]
                return True
        return self.engine.finish_request(request_id, now, "abort") is not None


def build_replicas(spec: FleetSpec) -> list[SimReplica]:
    """Fresh replicas (empty caches, zeroed counters) for one run."""
    profile = spec.model_profile
    return [SimReplica(i, name, Engine(profile, spec.engine)) for i, name in enumerate(spec.names)]

