from __future__ import annotations

from pathlib import Path

import pytest

from loadtests.des_cli import build_parser, fleet_spec, main, run, workload_plan
from loadtests.presets import get_preset
from loadtests.results import load_results
from loadtests.workload_factory import build_workload

pytestmark = pytest.mark.timeout(120)


def test_a_sweep_writes_the_benchs_results_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "des"
    code = main(["--replicas", "8", "--profile", "tiny", "--requests", "40", "--warmup-requests", "8",
                 "--concurrency", "2,8", "--policy", "default,round-robin", "--system-prompt-tokens", "256",
                 "--question-tokens", "16", "--output-tokens", "4", "--out", str(out), "--no-progress"])
    assert code == 0
    doc = load_results(out / "results.json")
    assert doc["meta"]["driver"] == "des" and doc["meta"]["fleet_size"] == 8
    runs = doc["runs"]
    assert [(r["policy"], r["concurrency"]) for r in runs] == [
        ("default", 2), ("default", 8), ("round-robin", 2), ("round-robin", 8)]
    assert all(r["driver"] == "des" and r["completed"] == 40 for r in runs)
    assert (out / "summary.md").exists() and list(out.glob("*.png"))
    assert capsys.readouterr().out.count("TTFT p50") == 4


def test_open_loop_and_other_workloads_build() -> None:
    parser = build_parser()
    for workload in ("random", "multi-turn", "lora-mix", "noisy-neighbour", "shared-prefix"):
        args = parser.parse_args(["--workload", workload, "--replicas", "8", "--profile", "tiny",
                                  "--system-prompt-tokens", "256", "--rate", "5,10"])
        fleet = fleet_spec(args)
        work = build_workload(workload_plan(args), fleet, requests=30, seed=args.seed)
        assert work.size() >= 30
        assert (fleet.engine.max_loras > 0) == (workload == "lora-mix")


@pytest.mark.parametrize("workload", ["shared-prefix", "random"])
def test_the_same_parameters_give_kvgate_bench_s_request_stream(workload: str) -> None:
    """One workload factory: des_cli's flags and a preset's plan with the same lengths on the same
    fleet yield the same requests (so a DES what-if and a live bench measure the same stream)."""
    preset = get_preset("routing")
    plan = next(p for p in preset.workloads if p.workload == workload)
    fleet = preset.fleet
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in plan.params.items()]
    args = build_parser().parse_args([
        "--workload", workload, "--replicas", str(fleet.replicas), "--profile", fleet.profile,
        "--kv-blocks", str(fleet.kv_blocks), "--block-size", str(fleet.block_size), "--seed", "3", *flags,
    ])  # fmt: skip
    des = build_workload(workload_plan(args), fleet_spec(args), requests=40, seed=args.seed)
    bench = build_workload(plan, fleet, requests=40, seed=3)
    assert des.describe() == bench.describe()
    assert [(s.body, s.headers) for s in des.requests()] == [(s.body, s.headers) for s in bench.requests()]


def test_closed_and_open_points_in_one_sweep(tmp_path: Path) -> None:
    code = main(["--replicas", "2", "--profile", "tiny", "--workload", "random", "--prompt-tokens", "32",
                 "--output-tokens", "4", "--requests", "12", "--concurrency", "2", "--rate", "50",
                 "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    runs = load_results(tmp_path / "results.json")["runs"]
    points = [(r["mode"], r["concurrency"], r["rate"]) for r in runs]
    assert points == [("closed", 2, None), ("open", None, 50.0)]


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--requests", "0"])
    assert main(["--profile", "nope", "--no-progress"]) == 2
    assert "unknown profile" in capsys.readouterr().err


def test_gateways_flag_puts_n_gateways_in_front_and_reports_herding(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args([
        "--replicas", "4", "--profile", "tiny", "--requests", "40", "--groups", "4", "--concurrency", "8",
        "--system-prompt-tokens", "256", "--question-tokens", "16", "--output-tokens", "4", "--gateways", "4",
        "--spread", "random", "--scrape-delay", "0.01", "--no-progress",
    ])  # fmt: skip
    (record,) = run(args, "test")
    des = record["des"]
    assert des["gateways"] == 4 and sum(des["gateway_requests"]) == 40 and len(des["gateway_requests"]) == 4
    assert des["views"]["spread"] == "random" and des["views"]["scrape_delay_s"] == 0.01
    assert des["in_flight_skew"]["samples"] == 40 and des["in_flight_skew"]["p99"] is not None
    assert "4 gateways" in capsys.readouterr().out
