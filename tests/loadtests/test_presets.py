"""Preset definitions: valid, buildable for their fleets, sized as documented, sliced the same for
every policy, and turned into `kvgate sim` arguments the simulator's own parser accepts."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from loadtests.default_weights import CHOSEN_DEFAULT, WEIGHT_CANDIDATES, DefaultWeights
from loadtests.presets import (
    BASELINE_POLICIES,
    DEFAULT_WORKLOAD_PLANS,
    DIRECT,
    PRESETS,
    BenchPreset,
    FleetPlan,
    get_preset,
    workload_plans,
)
from loadtests.workload_factory import WorkloadPlan, build_workload
from loadtests.workloads import WORKLOAD_TYPES, SharedPrefixWorkload
from policies.scheduling.builtin_profiles import BUILTIN_PROFILE_NAMES, builtin_profile_spec
from simulator import cli as sim_cli


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_its_workloads_with_enough_requests(name: str) -> None:
    preset = PRESETS[name]
    for plan in preset.workloads:
        total = preset.total_requests(plan)
        workload = build_workload(plan, preset.fleet, requests=total, seed=preset.seed)
        assert workload.name == plan.workload
        assert workload.size() >= total
        assert sum(1 for _ in workload.requests()) == workload.size()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_names_known_policies_and_profiles(name: str) -> None:
    preset = PRESETS[name]
    known = {*BUILTIN_PROFILE_NAMES, *preset.profiles, DIRECT}
    assert set(preset.policies) <= known
    for plan in preset.workloads:
        assert preset.policies_for(plan), plan


@pytest.mark.parametrize("name", ["quick", "full"])
def test_shared_prefix_working_set_is_3_to_6_replicas_and_fits_the_fleet(name: str) -> None:
    preset = PRESETS[name]
    plan = next(p for p in preset.workloads if p.workload == "shared-prefix")
    workload = build_workload(plan, preset.fleet, requests=preset.total_requests(), seed=0)
    assert isinstance(workload, SharedPrefixWorkload)
    kv = preset.fleet.replica_kv_tokens
    prefixes = workload.groups * workload.system_prompt_tokens
    assert 3 * kv <= prefixes <= 6 * kv
    assert prefixes <= 0.75 * preset.fleet.replicas * kv


def test_quick_runs_shared_prefix_and_random_for_the_four_policies_and_direct() -> None:
    quick = get_preset("quick")
    assert [p.workload for p in quick.workloads] == ["shared-prefix", "random"]
    assert set(BASELINE_POLICIES) | {DIRECT} <= set(quick.policies)


def test_full_runs_all_five_workloads_with_more_adapters_than_slots() -> None:
    full = get_preset("full")
    assert {p.workload for p in full.workloads} == set(WORKLOAD_TYPES)
    assert 0 < full.fleet.max_loras < len(full.fleet.adapters)
    lora = next(p for p in full.workloads if p.workload == "lora-mix")
    workload = build_workload(lora, full.fleet, requests=10, seed=0)
    assert workload.describe()["adapters"] == list(full.fleet.adapters)


def test_points_are_consecutive_slices_after_the_warmup_the_same_for_every_policy() -> None:
    preset = dataclasses.replace(
        get_preset("quick"),
        concurrency=(1, 4, 16),
        rates=(2.0,),
        requests=None,
        min_requests=10,
        requests_per_slot=2,
        warmup_requests=5,
        max_duration_s=99.0,
        open_duration_s=20.0,
        direct_points=1,
    )
    points = preset.points_for("default")
    assert points == [
        ("closed", 1.0, 10, 5),
        ("closed", 4.0, 10, 15),
        ("closed", 16.0, 32, 25),
        ("open", 2.0, 40, 57),
    ]
    assert preset.points_for("round-robin") == points
    assert preset.points_for(DIRECT) == points[:1]
    assert preset.total_requests() == 5 + 10 + 10 + 32 + 40
    assert dataclasses.replace(preset, direct_points=None).points_for(DIRECT) == points
    assert (preset.warmup_for("default"), preset.warmup_for(DIRECT)) == (5, 0)


def test_a_plan_may_replace_the_warmup_and_its_points_move_with_it() -> None:
    preset = dataclasses.replace(get_preset("quick"), requests=10, warmup_requests=5, concurrency=(1, 2))
    plan = WorkloadPlan("random", {"prompt_tokens": 8, "output_tokens": 2}, warmup_requests=0)
    assert preset.warmup_for("default", plan) == 0
    assert [o for *_, o in preset.points_for("default", plan)] == [0, 10]
    assert preset.total_requests(plan) == 20 and preset.total_requests() == 25


def test_fixed_requests_per_point_override_the_formula() -> None:
    preset = dataclasses.replace(get_preset("quick"), requests=7)
    assert {n for _, _, n, _ in preset.points_for("default")} == {7}


def _sim_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    sim_cli.add_arguments(parser)
    return parser


def test_fleet_plan_sim_args_are_what_the_simulator_cli_reads() -> None:
    plan = FleetPlan(
        replicas=3,
        profile="llama-3-8b-h100",
        time_scale=2.5,
        kv_blocks=512,
        max_loras=2,
        adapters=("a", "b", "c"),
    )
    args = plan.sim_args()
    assert args[0] == "sim"
    parsed = _sim_parser().parse_args(args[1:])
    assert (parsed.replicas, parsed.profile, parsed.time_scale, parsed.kv_blocks) == (
        3,
        "llama-3-8b-h100",
        2.5,
        512,
    )
    assert (parsed.port, parsed.adapters, parsed.max_loras) == (0, "a,b,c", 2)
    assert plan.replica_kv_tokens == 512 * 16
    assert plan.model_name == "llama-3-8b"


def test_fleet_plan_without_kv_blocks_keeps_the_profiles_capacity() -> None:
    plan = FleetPlan(replicas=1, profile="tiny", time_scale=1.0)
    parsed = _sim_parser().parse_args(plan.sim_args()[1:])
    assert parsed.kv_blocks is None and parsed.adapters == ""
    assert plan.replica_kv_tokens == 1025 * 16


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"workloads": ()}, "no workloads"),
        ({"policies": ()}, "no policies"),
        ({"concurrency": (), "rates": ()}, "no load points"),
        ({"concurrency": (0,)}, "concurrency"),
        ({"rates": (-1.0,)}, "rates"),
        ({"requests": 0}, "requests"),
        ({"gateway_tokenizer": "bpe"}, "tokenizer"),
        ({"warmup_s": -1.0}, "warmup_s"),
        ({"warmup_s": float("nan")}, "warmup_s"),
    ],
)
def test_invalid_presets_are_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(get_preset("tiny"), **change)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"replicas": 0}, "replicas"),
        ({"time_scale": 0.0}, "time_scale"),
        ({"kv_blocks": 0}, "kv_blocks"),
        ({"profile": "gpt-9"}, "gpt-9"),
    ],
)
def test_invalid_fleets_are_refused(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"replicas": 2, "profile": "tiny", "time_scale": 1.0}
    with pytest.raises(ValueError, match=message):
        FleetPlan(**{**base, **kwargs})  # type: ignore[arg-type]


def test_unknown_preset_and_workload_names_are_refused() -> None:
    with pytest.raises(ValueError, match="known: quick"):
        get_preset("nope")
    with pytest.raises(ValueError, match="unknown workload"):
        WorkloadPlan("nope")
    with pytest.raises(ValueError, match="unknown workload"):
        workload_plans(get_preset("quick"), ["nope"])


def test_workload_names_pick_the_presets_plan_else_the_default_plan() -> None:
    quick = get_preset("quick")
    plans = workload_plans(quick, ["random", "multi-turn"])
    assert plans[0] is next(p for p in quick.workloads if p.workload == "random")
    assert plans[1] is DEFAULT_WORKLOAD_PLANS["multi-turn"]
    assert workload_plans(quick, None) == quick.workloads


def test_workload_names_may_be_labels() -> None:
    weights = get_preset("weights")
    plans = workload_plans(weights, ["shared-prefix-hot", "shared-prefix"])
    assert [p.name for p in plans] == ["shared-prefix-hot", "shared-prefix"]
    assert plans[0].params["groups"] == 2 and "groups" not in plans[1].params


def test_a_plan_may_restrict_its_policies() -> None:
    plan = WorkloadPlan("random", {"prompt_tokens": 8, "output_tokens": 2}, policies=("default",))
    preset = dataclasses.replace(get_preset("tiny"), workloads=(plan,), policies=("round-robin", "default"))
    assert preset.policies_for(plan) == ("default",)


def test_a_workload_type_may_run_twice_under_two_labels() -> None:
    plan = WorkloadPlan("random", {"prompt_tokens": 8, "output_tokens": 2})
    assert plan.name == "random" and dataclasses.replace(plan, label="random-b").name == "random-b"
    with pytest.raises(ValueError, match="twice"):
        dataclasses.replace(get_preset("tiny"), workloads=(plan, plan))
    preset = dataclasses.replace(get_preset("tiny"), workloads=(plan, dataclasses.replace(plan, label="b")))
    assert [p.name for p in preset.workloads] == ["random", "b"]


def test_weights_preset_compares_candidates_of_the_default_profile() -> None:
    preset = get_preset("weights")
    assert {p.name for p in preset.workloads} == {"shared-prefix", "shared-prefix-hot", "random"}
    built_in = {s["type"] for s in builtin_profile_spec("default")["scorers"]}
    for name, spec in preset.profiles.items():
        assert name in preset.policies
        assert {s["type"] for s in spec["scorers"]} <= built_in | {"kv-headroom"}


def test_default_weights_variant_sets_weights_guard_and_kv_full() -> None:
    variant = DefaultWeights(5, 1, 0.5, (16, 1.0), 0.9)
    spec = variant.spec()
    weights = {s["type"]: s["weight"] for s in spec["scorers"]}
    assert (weights["prefix-affinity"], weights["queue-depth"], weights["kv-headroom"]) == (5, 1, 0.5)
    params = {f["type"]: f.get("params") for f in spec["filters"]}
    assert params["load-guard"] == {"abs_slack": 16, "rel_slack": 1.0} and params["kv-full"] == {
        "threshold": 0.9
    }
    assert variant.name == "p5-q1-k0.5-g16-1-f0.9"
    bare = DefaultWeights(3, 2, 1, None, None)
    assert {f["type"] for f in bare.spec()["filters"]} == {
        "in-service",
        "slow-start",
        "in-flight-cap",
        "latency-knee",
        "healthy",
        "serves-model",
        "serves-adapter",
        "fresh",
    }
    assert bare.name == "p3-q2-k1-noguard-nofull"


def test_the_chosen_candidate_is_the_built_in_default_and_the_first_the_provisional_one() -> None:
    from policies.scheduling.registry import build_profile

    assert CHOSEN_DEFAULT in WEIGHT_CANDIDATES
    assert CHOSEN_DEFAULT.spec() == builtin_profile_spec("default")
    provisional = DefaultWeights(3, 2, 1, (8, 0.5), 0.98)
    assert WEIGHT_CANDIDATES[0] == provisional
    first = provisional.spec()
    assert [s["weight"] for s in first["scorers"]][:3] == [3.0, 2.0, 1.0]
    built_in = CHOSEN_DEFAULT.spec()

    assert [f["type"] for f in first["filters"]][-2:] == ["kv-full", "load-guard"]
    assert [f["type"] for f in built_in["filters"]][-1] == "load-guard"
    build_profile(first)  # valid profiles
    build_profile(built_in)


def test_shared_prefix_with_explicit_groups_skips_sizing() -> None:
    plan = WorkloadPlan(
        "shared-prefix", {"groups": 3, "system_prompt_tokens": 64, "question_tokens": 8, "output_tokens": 2}
    )
    workload = build_workload(plan, get_preset("tiny").fleet, requests=10, seed=1)
    assert isinstance(workload, SharedPrefixWorkload)
    assert workload.groups == 3 and workload.size() == 12 and workload.sizing is None


def test_the_same_seed_gives_the_same_stream() -> None:
    preset: BenchPreset = get_preset("quick")
    plan = preset.workloads[0]
    a = [s.body for s in build_workload(plan, preset.fleet, requests=20, seed=3).requests()]
    b = [s.body for s in build_workload(plan, preset.fleet, requests=20, seed=3).requests()]
    assert a == b
