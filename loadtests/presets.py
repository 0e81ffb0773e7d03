"""Named benchmark presets: the fleet, the workloads, the policies and the load sweep of a `kvgate bench`.

A preset is plain data (`BenchPreset`); `kvgate bench --preset NAME` starts from it and command-line
flags override single fields. `loadtests.workload_factory.build_workload` turns each `WorkloadPlan` into
a seeded workload sized for the fleet and for the number of requests the sweep needs.

Times in a preset are SIMULATED seconds (what the modelled GPUs would take); the simulator runs
`time_scale` times slower than that in wall time, and the bench reports latencies and rates in
simulated time (wall / time_scale). See `docs/benchmarks.md` for why each preset is sized as it is.

Sizing (DESIGN.md "Measuring", napkin.md): the shared-prefix groups' prefixes together need 3-6x one
replica's KV cache and fit in the fleet's. A real llama-3-8b-h100 replica holds ~411k tokens; the
presets shrink the simulated KV cache with `kv_blocks` (a stated deviation) instead of sending
million-token working sets through this 2-core machine, and keep the profile's step times.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from loadtests.default_weights import CANDIDATE_PROFILES
from loadtests.workload_factory import WorkloadPlan
from loadtests.workloads import WORKLOAD_TYPES
from simulator.profiles import get_profile

BASELINE_POLICIES: tuple[str, ...] = ("round-robin", "least-loaded", "prefix-only", "default")
DIRECT = "direct"  # load straight to the first replica, no gateway


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """The simulated fleet (`kvgate sim` arguments). `kv_blocks` None keeps the profile's capacity;
    `time_scale` is wall seconds per simulated second; `adapters` are loaded at start with
    `max_loras` slots per replica (0 = no LoRA)."""

    replicas: int
    profile: str
    time_scale: float
    kv_blocks: int | None = None
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_loras: int = 0
    adapters: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.replicas < 1 or not self.time_scale > 0 or self.block_size < 1:
            raise ValueError("replicas and block_size must be >= 1 and time_scale > 0")
        if self.kv_blocks is not None and self.kv_blocks < 1:
            raise ValueError(f"kv_blocks must be >= 1, got {self.kv_blocks}")
        get_profile(self.profile)  # ValueError naming the known profiles

    @property
    def model_name(self) -> str:
        """The base model name the replicas serve (the profile's)."""
        return get_profile(self.profile).model_name

    @property
    def replica_kv_tokens(self) -> int:
        """One replica's KV capacity in tokens."""
        blocks = (
            self.kv_blocks
            if self.kv_blocks is not None
            else get_profile(self.profile).num_gpu_blocks(self.block_size)
        )
        return blocks * self.block_size

    def sim_args(self) -> list[str]:
        """`kvgate sim` arguments for this fleet on free ports."""
        out = [
            "sim", "--replicas", str(self.replicas), "--port", "0", "--profile", self.profile,
            "--time-scale", repr(self.time_scale), "--block-size", str(self.block_size),
            "--max-num-seqs", str(self.max_num_seqs),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
        ]  # fmt: skip
        if self.kv_blocks is not None:
            out += ["--kv-blocks", str(self.kv_blocks)]
        if self.adapters:
            out += ["--adapters", ",".join(self.adapters), "--max-loras", str(max(1, self.max_loras))]
        return out

    def describe(self) -> dict[str, Any]:
        p = get_profile(self.profile)
        return {
            "replicas": self.replicas,
            "profile": self.profile,
            "model": p.model_name,
            "time_scale": self.time_scale,
            "block_size": self.block_size,
            "kv_blocks": self.kv_blocks,
            "replica_kv_tokens": self.replica_kv_tokens,
            "profile_kv_tokens": p.kv_capacity_tokens(),
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_loras": self.max_loras,
            "adapters": list(self.adapters),
        }


@dataclass(frozen=True, slots=True)
class BenchPreset:
    """One benchmark: the fleet, the workloads (run one after another), the policies (each on a fresh
    gateway over the same fleet, caches reset between them), and the load sweep.

    Load points: closed loop at each `concurrency`, then open loop at each `rates` (requests/s).
    Requests per point: `requests` when set, else max(`min_requests`, `requests_per_slot` x
    concurrency) closed loop and max(`min_requests`, rate x `open_duration_s`) open loop (arrivals
    stop after `open_duration_s` simulated seconds, or when the point's requests are sent). Before its
    first point each policy sends `warmup_requests` unmeasured requests (so every policy starts from
    its own steady state, not from an empty cache); inside each point the first `warmup_s` are not
    measured. `max_duration_s` bounds a point (simulated seconds; requests still running
    `drain_s` after it are cancelled and counted incomplete). The policy `direct` sends straight to
    the first replica, no gateway (the gateway's overhead, and a one-replica reference); it runs only
    the `direct_points` lowest load points (None: all). `profiles` are custom
    scheduling profiles (config `scheduling.profiles` form) made available to every gateway.
    """

    name: str
    description: str
    fleet: FleetPlan
    workloads: tuple[WorkloadPlan, ...]
    policies: tuple[str, ...] = BASELINE_POLICIES
    concurrency: tuple[int, ...] = (1, 4, 16, 64)
    rates: tuple[float, ...] = ()
    requests: int | None = None
    min_requests: int = 24
    requests_per_slot: int = 4
    warmup_requests: int = 0
    warmup_s: float = 0.0
    max_duration_s: float = 120.0
    open_duration_s: float = 10.0
    drain_s: float = 30.0
    direct_points: int | None = 1
    slo: str = "ttft=1s,tpot=100ms"
    seed: int = 0
    profiles: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    gateway_tokenizer: str = "none"
    flow_control: Mapping[str, Any] = field(default_factory=dict)  # merged into the gateway's
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.workloads:
            raise ValueError(f"preset {self.name!r} has no workloads")
        names = [p.name for p in self.workloads]
        if len(set(names)) != len(names):
            raise ValueError(f"preset {self.name!r} runs a workload twice: label one of {names}")
        if not self.policies:
            raise ValueError(f"preset {self.name!r} has no policies")
        if not self.concurrency and not self.rates:
            raise ValueError(f"preset {self.name!r} has no load points")
        if any(c < 1 for c in self.concurrency) or any(not r > 0 for r in self.rates):
            raise ValueError("concurrency must be >= 1 and rates > 0")
        if not (self.max_duration_s > 0 and self.open_duration_s > 0 and self.drain_s >= 0):
            raise ValueError("max_duration_s and open_duration_s must be > 0 and drain_s >= 0")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise ValueError(f"warmup_s must be finite and >= 0, got {self.warmup_s}")
        if self.gateway_tokenizer not in ("none", "sim"):
            raise ValueError(f"gateway_tokenizer must be none or sim, got {self.gateway_tokenizer!r}")

    def load_points(self) -> list[tuple[str, float]]:
        """("closed", concurrency) then ("open", rate) points, in sweep order."""
        return [("closed", float(c)) for c in self.concurrency] + [("open", r) for r in self.rates]

    def point_requests(self, mode: str, load: float) -> int:
        """Requests sent at one load point (warm-up included)."""
        if self.requests is not None:
            return self.requests
        if mode == "closed":
            return max(self.min_requests, self.requests_per_slot * int(load))
        return max(self.min_requests, math.ceil(load * self.open_duration_s))

    def plan_warmup(self, plan: WorkloadPlan | None = None) -> int:
        """Warm-up requests before a workload's first point: the plan's own count, else the preset's."""
        if plan is not None and plan.warmup_requests is not None:
            return plan.warmup_requests
        return self.warmup_requests

    def warmup_for(self, policy: str, plan: WorkloadPlan | None = None) -> int:
        """Warm-up requests `policy` sends: none for `direct` (it measures overhead, at low load)."""
        return 0 if policy == DIRECT else self.plan_warmup(plan)

    def total_requests(self, plan: WorkloadPlan | None = None) -> int:
        """Length of a workload's request stream: warm-up plus every load point."""
        return self.plan_warmup(plan) + sum(self.point_requests(m, x) for m, x in self.load_points())

    def policies_for(self, plan: WorkloadPlan) -> tuple[str, ...]:
        """The policies that run `plan`: the preset's, restricted to the plan's own list if it has one."""
        return tuple(p for p in self.policies if not plan.policies or p in plan.policies)

    def points_for(self, policy: str, plan: WorkloadPlan | None = None) -> list[tuple[str, float, int, int]]:
        """(mode, load, requests, offset into the request stream) of each point `policy` runs.

        Point k's requests are the stream's slice after the warm-up and points 0..k-1, whichever
        policy runs it, so every policy sees the same prompts at the same load."""
        out, offset = [], self.plan_warmup(plan)
        for mode, load in self.load_points():
            n = self.point_requests(mode, load)
            out.append((mode, load, n, offset))
            offset += n
        if policy == DIRECT and self.direct_points is not None:
            return out[: self.direct_points]
        return out

    def with_overrides(self, **changes: Any) -> BenchPreset:
        """A copy with the given fields replaced (validated again)."""
        return replace(self, **changes)


# --- the presets ----------------------------------------------------------------------------------

# Prompt shape shared by shared-prefix and random, so the two differ only in what is shared: 4,096
# system tokens + 256 question tokens vs 4,352 unique tokens; 64 output tokens (ignore_eos). With
# 32,768 KV tokens per replica and 4 replicas that is 24 groups, 3x one replica's KV, 75% of the fleet's.
_SHARED_PREFIX = WorkloadPlan(
    "shared-prefix", {"system_prompt_tokens": 4096, "question_tokens": 256, "output_tokens": 64}
)
# Random prompt lengths vary by +-25%: with equal lengths a closed loop falls into lockstep (every
# replica prefills at the same moments) and TTFT jumps between multiples of one prefill's time.
_RANDOM = WorkloadPlan(
    "random", {"prompt_tokens": 4352, "output_tokens": 64, "length_jitter": 0.25}, warmup_requests=0
)
# Two hot system prompts on four replicas: prefix affinity alone would herd each onto one replica
# (or both onto one); the load terms must spread them. It fits one replica, so it is no test of the
# cache's reach, only of anti-herding.
_HOT_PREFIX = WorkloadPlan(
    "shared-prefix",
    {"groups": 2, "system_prompt_tokens": 4096, "question_tokens": 256, "output_tokens": 64},
    label="shared-prefix-hot",
)
_MULTI_TURN = WorkloadPlan(
    "multi-turn",
    {"turns": 4, "system_prompt_tokens": 1024, "user_tokens": 256, "output_tokens": 64,
     "active_conversations": 48},
)  # fmt: skip
# The case 1 (#11): long new turns, so a turn's held history is 50-75% of its prompt and a
# conversation moves under `default` whenever its replica has one more request in flight.
_CONVERSATIONS = WorkloadPlan(
    "multi-turn",
    {"turns": 4, "system_prompt_tokens": 256, "user_tokens": 768, "output_tokens": 256,
     "active_conversations": 16},
    label="multi-turn-long",
)  # fmt: skip
# Chat-sized prompts: a 256-token prompt's unloaded TTFT is about one decode step, the case where the
# latency gate's knee must allow for the step under way (docs/benchmarks.md, "A decode step in the
# knee").
_SHORT = WorkloadPlan(
    "random",
    {"prompt_tokens": 256, "output_tokens": 128, "length_jitter": 0.25},
    warmup_requests=0,
    label="random-short",
)
_LORA_MIX = WorkloadPlan("lora-mix", {"prompt_tokens": 1024, "output_tokens": 64, "zipf_s": 1.0})
_NOISY = WorkloadPlan("noisy-neighbour", {"prompt_tokens": 1024, "output_tokens": 64})

DEFAULT_WORKLOAD_PLANS: Mapping[str, WorkloadPlan] = MappingProxyType(
    {p.workload: p for p in (_SHARED_PREFIX, _RANDOM, _MULTI_TURN, _LORA_MIX, _NOISY)}
)
"""The plan used for a workload named on the command line that the preset does not define."""

# 4 replicas x 2,048 blocks of 16 = 32,768 tokens each (a real H100 holds ~411k: 1/12.5 of it).
_FLEET = FleetPlan(replicas=4, profile="llama-3-8b-h100", time_scale=2.0, kv_blocks=2048)
_ADAPTERS = tuple(f"lora-{i}" for i in range(8))

_PRESETS: dict[str, BenchPreset] = {
    "quick": BenchPreset(
        name="quick",
        description="shared-prefix and random, the four policies and direct, a short closed-loop sweep",
        fleet=_FLEET,
        workloads=(_SHARED_PREFIX, _RANDOM),
        policies=(*BASELINE_POLICIES, DIRECT),
        concurrency=(4, 16, 64),
        min_requests=16,
        requests_per_slot=2,
        warmup_requests=48,
        warmup_s=0.1,
        max_duration_s=60.0,
    ),
    "routing": BenchPreset(
        name="routing",
        description="the measurement in docs/benchmarks.md: shared-prefix and random, the four "
        "policies and direct, closed loop 4-64 streams and open loop 5 and 10 req/s, time scale 5",
        fleet=replace(_FLEET, time_scale=5.0),
        workloads=(_SHARED_PREFIX, _RANDOM),
        policies=(*BASELINE_POLICIES, DIRECT),
        concurrency=(4, 8, 16, 32, 64),
        rates=(5.0, 10.0),
        min_requests=24,
        requests_per_slot=3,
        warmup_requests=48,
        warmup_s=0.1,
        max_duration_s=60.0,
        open_duration_s=10.0,
    ),
    "full": BenchPreset(
        name="full",
        description="all five workloads (lora-mix on 8 adapters with 2 slots per replica; noisy-neighbour "
        "with 4 tenants, one offering 70%), the four policies, random routing and direct, 1-64 streams",
        fleet=replace(_FLEET, max_loras=2, adapters=_ADAPTERS),
        workloads=(_SHARED_PREFIX, _RANDOM, _MULTI_TURN, _LORA_MIX, _NOISY),
        policies=(*BASELINE_POLICIES, "random", DIRECT),
        concurrency=(1, 4, 16, 64),
        min_requests=32,
        requests_per_slot=4,
        warmup_requests=96,
        direct_points=2,
        max_duration_s=120.0,
    ),
    "weights": BenchPreset(
        name="weights",
        description="candidate weightings of the default profile on shared-prefix, two hot prefixes and "
        "random (c=16-64), with round-robin, least-loaded and prefix-only for reference",
        fleet=replace(_FLEET, time_scale=4.0),
        workloads=(
            _SHARED_PREFIX,
            _HOT_PREFIX,
            _RANDOM,
        ),
        policies=("round-robin", "least-loaded", "prefix-only", *CANDIDATE_PROFILES),
        profiles=CANDIDATE_PROFILES,
        concurrency=(16, 32, 64),
        min_requests=24,
        requests_per_slot=3,
        warmup_requests=48,
        warmup_s=0.1,
        max_duration_s=60.0,
    ),
    "short-prompts": BenchPreset(
        name="short-prompts",
        description="chat-sized random prompts (256 tokens, 128-token answers), default against "
        "predicted-latency, 8 and 32 streams (2 and 8 per replica), the latency gate on",
        fleet=_FLEET,
        workloads=(_SHORT,),
        policies=("default", "predicted-latency"),
        concurrency=(8, 32),
        requests=240,
        warmup_requests=32,
        max_duration_s=120.0,
    ),
    "conversations": BenchPreset(
        name="conversations",
        description="multi-turn conversations with long new turns (issue #11), default against "
        "predicted-latency, 8 streams (2 per replica), time scale 4",
        fleet=replace(_FLEET, time_scale=4.0),
        workloads=(_CONVERSATIONS,),
        policies=("default", "predicted-latency"),
        concurrency=(8,),
        requests=120,
        warmup_requests=32,
        max_duration_s=120.0,
        gateway_tokenizer="sim",
        # The gate stays off: the routing profiles are compared, not admission.
        flow_control={"predicted_admission": False},
    ),
    "tiny": BenchPreset(
        name="tiny",
        description="a smoke test: the tiny profile, 2 replicas, random prompts, 2 policies, 1 load point",
        fleet=FleetPlan(replicas=2, profile="tiny", time_scale=1.0),
        workloads=(WorkloadPlan("random", {"prompt_tokens": 128, "output_tokens": 4}),),
        policies=("round-robin", "default"),
        concurrency=(2,),
        requests=8,
        max_duration_s=30.0,
        drain_s=10.0,
        slo="ttft=1s",
    ),
}

PRESETS: Mapping[str, BenchPreset] = MappingProxyType(_PRESETS)


def get_preset(name: str) -> BenchPreset:
    """The preset called `name`; ValueError naming the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None


def workload_plans(preset: BenchPreset, names: Sequence[str] | None) -> tuple[WorkloadPlan, ...]:
    """The preset's plans, or the named ones: a name is one of the preset's plan names (labels
    included), else a workload type, run with the preset's plan of that type or the default plan."""
    if not names:
        return preset.workloads
    by_name = {p.name: p for p in preset.workloads}
    by_type: dict[str, WorkloadPlan] = {}
    for p in preset.workloads:
        by_type.setdefault(p.workload, p)
    out = []
    for name in names:
        if name in by_name:
            out.append(by_name[name])
        elif name in WORKLOAD_TYPES:
            out.append(by_type.get(name) or DEFAULT_WORKLOAD_PLANS[name])
        else:
            known = sorted({*by_name, *WORKLOAD_TYPES})
            raise ValueError(f"unknown workload {name!r}; known: {', '.join(known)}")
    return tuple(out)
