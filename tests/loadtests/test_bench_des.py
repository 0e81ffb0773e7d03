"""`kvgate bench --des`: the preset translated into `loadtests.des_cli` arguments, and a real tiny run."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import yaml

from gateway.cli import main as kvgate_main
from loadtests.bench_des import des_argv, run_des
from loadtests.des_cli import build_parser, fleet_spec, workload_plan
from loadtests.presets import DIRECT, PRESETS, get_preset
from loadtests.results import load_results
from loadtests.workload_factory import WorkloadPlan, build_workload


def test_the_preset_becomes_des_cli_arguments_its_parser_reads(tmp_path: Path) -> None:
    preset = dataclasses.replace(get_preset("quick"), rates=(3.0,))
    plan = preset.workloads[0]
    (closed, open_), notes = des_argv(preset, plan, tmp_path, None, progress=False)
    args = build_parser().parse_args(closed)
    fleet = preset.fleet
    assert (args.replicas, args.profile, args.kv_blocks) == (fleet.replicas, fleet.profile, fleet.kv_blocks)
    assert (
        args.workload == "shared-prefix" and args.system_prompt_tokens == plan.params["system_prompt_tokens"]
    )
    assert args.policy.split(",") == [p for p in preset.policies if p != DIRECT]
    assert (args.concurrency, args.rate, args.out) == ("4,16,64", None, tmp_path / "des-shared-prefix")
    open_args = build_parser().parse_args(open_)
    assert (open_args.concurrency, open_args.rate, open_args.out) == (
        None,
        "3",
        tmp_path / "des-shared-prefix-open",
    )
    assert (args.duration, open_args.duration) == (preset.max_duration_s, preset.open_duration_s)
    assert args.requests == max(preset.point_requests(m, x) for m, x in preset.load_points())
    assert args.warmup_requests == preset.plan_warmup(plan) and args.slo == preset.slo and args.no_progress
    assert args.flow_control  # as the live bench's gateway runs
    assert notes == ["direct skipped: there is no HTTP path in virtual time"]


def test_every_presets_workload_reaches_the_des_unchanged(tmp_path: Path) -> None:
    """`kvgate bench --des` runs the request stream the live bench would: each shipped preset's
    workloads, through des_cli's flags, come out of the workload factory as the same workload."""
    for preset in PRESETS.values():
        for plan in preset.workloads:
            runs, notes = des_argv(preset, plan, tmp_path, None, progress=True)
            assert not [n for n in notes if "has no des_cli flag" in n], (preset.name, notes)
            args = build_parser().parse_args(runs[0])
            des = build_workload(workload_plan(args), fleet_spec(args), requests=30, seed=args.seed)
            bench = build_workload(plan, preset.fleet, requests=30, seed=preset.seed)
            assert des.describe() == bench.describe(), (preset.name, plan.name)


def test_parameters_without_a_flag_are_named(tmp_path: Path) -> None:
    preset = get_preset("full")
    plan = WorkloadPlan("random", {"prompt_tokens": 64, "output_tokens": 4, "endpoint": "completions"})
    (argv,), notes = des_argv(preset, plan, tmp_path, None, progress=True)
    assert any("endpoint=completions has no des_cli flag" in n for n in notes)
    args = build_parser().parse_args(argv)
    assert (args.adapters, args.max_loras) == (len(preset.fleet.adapters), preset.fleet.max_loras)


def test_custom_profiles_reach_the_des_through_a_gateway_config(tmp_path: Path) -> None:
    preset = get_preset("weights")
    calls: list[list[str]] = []

    def fake_main(argv: Sequence[str]) -> int:
        calls.append(list(argv))
        return 0

    assert run_des(preset, preset.workloads, tmp_path, fake_main, progress=False, say=lambda _: None) == 0
    outs = [call[call.index("--out") + 1] for call in calls]
    assert outs == [str(tmp_path / f"des-{p.name}") for p in preset.workloads]
    config_path = Path(calls[0][calls[0].index("--gateway-config") + 1])
    assert set(yaml.safe_load(config_path.read_text())["scheduling"]["profiles"]) == set(preset.profiles)


def test_the_presets_flow_control_settings_reach_the_des(tmp_path: Path) -> None:
    preset = dataclasses.replace(
        get_preset("tiny"), flow_control={"predicted_admission": False, "knee_factor": 2.0}
    )
    calls: list[list[str]] = []

    def fake_main(argv: Sequence[str]) -> int:
        calls.append(list(argv))
        return 0

    assert run_des(preset, preset.workloads, tmp_path, fake_main, progress=False, say=lambda _: None) == 0
    config_path = Path(calls[0][calls[0].index("--gateway-config") + 1])
    assert yaml.safe_load(config_path.read_text()) == {
        "flow_control": {"predicted_admission": False, "knee_factor": 2.0}
    }
    assert "--flow-control" in calls[0]


def test_run_des_stops_at_the_first_failure(tmp_path: Path) -> None:
    preset = dataclasses.replace(
        get_preset("tiny"),
        workloads=(WorkloadPlan("random", {"prompt_tokens": 8}), WorkloadPlan("random", label="b")),
    )
    calls: list[Sequence[str]] = []

    def failing(argv: Sequence[str]) -> int:
        calls.append(argv)
        return 3

    assert run_des(preset, preset.workloads, tmp_path, failing, say=lambda _: None) == 3
    assert len(calls) == 1


def test_kvgate_bench_des_runs_the_tiny_preset(tmp_path: Path) -> None:
    assert kvgate_main(["bench", "--des", "--preset", "tiny", "--out", str(tmp_path), "--no-progress"]) == 0
    doc = load_results(tmp_path / "des-random" / "results.json")
    assert [r["policy"] for r in doc["runs"]] == ["round-robin", "default"]
    assert all(r["completed"] == 8 for r in doc["runs"])


def test_the_session_header_flag_reaches_multi_turn_plans_and_the_des(tmp_path: Path) -> None:
    import argparse

    from gateway.commands.bench import add_arguments, resolve

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--out", str(tmp_path), "--preset", "conversations", "--session-header"])
    preset, (plan,) = resolve(args)
    assert plan.params["session_header"] == "x-session-id"
    (argv,), notes = des_argv(preset, plan, tmp_path, None, progress=False)
    assert not any("session_header" in n for n in notes)
    assert build_parser().parse_args(argv).session_header == "x-session-id"
    _, (bare,) = resolve(parser.parse_args(["--out", str(tmp_path), "--preset", "conversations"]))
    assert "session_header" not in bare.params
