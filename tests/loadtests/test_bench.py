"""`kvgate bench`: argument parsing, the generated gateway config, the clock conversion, and end-to-end
runs of the tiny preset as a child process (results, summary, plots, cache resets, no orphans, and a
clean stop on SIGINT/SIGTERM)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.cli import build_parser
from gateway.commands.bench import _left_behind, resolve
from gateway.config import parse_config
from loadtests.bench import gateway_config, to_model_time
from loadtests.measures import LoadgenUsage, RequestTrace
from loadtests.presets import DIRECT, get_preset
from loadtests.results import load_results
from loadtests.runner import LoadConfig, RunResult
from loadtests.workload_factory import build_workload
from loadtests.workloads import NoisyNeighbourWorkload, RandomWorkload

REPO = Path(__file__).resolve().parents[2]


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", *argv])


# --- arguments ------------------------------------------------------------------------------------


def test_flags_override_the_preset() -> None:
    args = _args(
        "--out",
        "x",
        "--preset",
        "quick",
        "--workload",
        "random",
        "--policies",
        "default,round-robin",
        "--concurrency",
        "1,4",
        "--rate",
        "2.5",
        "--requests",
        "10",
        "--duration",
        "9",
        "--replicas",
        "6",
        "--profile",
        "tiny",
        "--time-scale",
        "2",
        "--kv-blocks",
        "256",
        "--slo",
        "ttft=2s,tpot=40ms",
        "--seed",
        "7",
        "--direct",
        "--open-duration",
        "12",
        "--warmup-s",
        "2.5",
        "--gateway-tokenizer",
        "sim",
    )
    preset, plans = resolve(args)
    assert [p.workload for p in plans] == ["random"]
    assert preset.policies == ("default", "round-robin", DIRECT)
    assert (preset.concurrency, preset.rates, preset.requests, preset.max_duration_s) == (
        (1, 4),
        (2.5,),
        10,
        9.0,
    )
    assert (preset.fleet.replicas, preset.fleet.profile, preset.fleet.time_scale, preset.fleet.kv_blocks) == (
        6,
        "tiny",
        2.0,
        256,
    )
    assert (preset.slo, preset.seed, preset.gateway_tokenizer) == ("ttft=2s,tpot=40ms", 7, "sim")
    assert (preset.open_duration_s, preset.warmup_s) == (12.0, 2.5)


def test_without_flags_the_preset_is_kept() -> None:
    preset, plans = resolve(_args("--out", "x"))
    quick = get_preset("quick")
    assert preset == quick and plans == quick.workloads


def test_no_direct_drops_it_and_kv_blocks_zero_restores_the_profiles_cache() -> None:
    preset, _ = resolve(_args("--out", "x", "--no-direct", "--kv-blocks", "0"))
    assert DIRECT not in preset.policies and preset.fleet.kv_blocks is None


def test_custom_profiles_file_adds_policies(tmp_path: Path) -> None:
    path = tmp_path / "profiles.yaml"
    path.write_text("heavy:\n  scorers:\n    - {type: prefix-affinity, weight: 9}\n")
    preset, _ = resolve(_args("--out", "x", "--profiles", str(path), "--policies", "heavy,default"))
    assert preset.policies == ("heavy", "default") and "heavy" in preset.profiles


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policies", "fastest"], "unknown policies"),
        (["--slo", "ttft=fast"], "ttft"),
        (["--workload", "everything"], "unknown workload"),
        (["--preset", "huge"], "unknown preset"),
    ],
)
def test_bad_values_are_refused_with_a_reason(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve(_args("--out", "x", *argv))


@pytest.mark.parametrize("argv", [["--concurrency", "0,4"], ["--concurrency", "a"], ["--rate", "-1"]])
def test_bad_sweeps_are_refused_by_the_parser(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _args("--out", "x", *argv)


def test_list_presets_needs_no_out(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.commands.bench import run

    assert run(_args("--list-presets")) == 0
    out = capsys.readouterr().out
    assert "quick:" in out and "full:" in out


# --- the generated gateway config -----------------------------------------------------------------


def test_gateway_config_is_a_valid_config_for_the_policy() -> None:
    preset = get_preset("quick")
    workload = build_workload(preset.workloads[1], preset.fleet, requests=4, seed=0)
    urls = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    data = gateway_config("least-loaded", urls, "llama-3-8b", preset=preset, workload=workload, port=9100)
    config = parse_config(data)
    assert config.scheduling.profile == "least-loaded"
    assert [r.url for r in config.replicas] == urls and {r.model for r in config.replicas} == {"llama-3-8b"}
    assert config.server.port == 9100 and not config.tenants
    assert config.server.drain_propagation_s == 0.0  # stopping a gateway does not wait for a balancer
    scale = preset.fleet.time_scale
    assert config.flow_control.bands["standard"].max_wait_s == 10.0 * scale


def test_noisy_neighbour_gets_one_tenant_per_key() -> None:
    from gateway.auth_keys import hash_key

    preset = get_preset("tiny")
    workload = NoisyNeighbourWorkload(requests=4, prompt_tokens=8, output_tokens=2, model="tiny-llama")
    config = parse_config(
        gateway_config(
            "default", ["http://127.0.0.1:9"], "tiny-llama", preset=preset, workload=workload, port=1
        )
    )
    assert {t.name: t.api_keys for t in config.tenants} == {
        t.name: (hash_key(t.key()),) for t in workload.tenants
    }


def test_custom_profiles_go_into_the_config() -> None:
    preset = get_preset("tiny").with_overrides(
        profiles={"heavy": {"scorers": [{"type": "prefix-affinity", "weight": 9.0}]}}, policies=("heavy",)
    )
    workload = RandomWorkload(requests=1, prompt_tokens=8, output_tokens=2, model="tiny-llama")
    config = parse_config(
        gateway_config(
            "heavy", ["http://127.0.0.1:9"], "tiny-llama", preset=preset, workload=workload, port=1
        )
    )
    assert config.scheduling.profile == "heavy"
    assert config.scheduling.profiles["heavy"].scorers[0].weight == 9.0


# --- the clock ------------------------------------------------------------------------------------


def _trace(start: float, first: float, end: float) -> RequestTrace:
    return RequestTrace("r", None, None, start, first, end, [first, end], 2, 10, 0, 200, None)


def test_model_time_divides_every_interval_by_the_time_scale() -> None:
    config = LoadConfig(concurrency=1, warmup_s=8.0, duration_s=40.0)
    result = RunResult(
        config,
        [_trace(104.0, 108.0, 112.0)],
        started=100.0,
        warmup_end=108.0,
        wall_s=20.0,
        sent=1,
        incomplete=0,
        loadgen=LoadgenUsage(1.0, 20.0, 1),
        max_schedule_lag_s=0.0,
    )
    scaled = to_model_time(result, 4.0, warmup_s=2.0, duration_s=10.0)
    t = scaled.traces[0]
    assert (t.start, t.first_token, t.end, t.chunk_times) == (101.0, 102.0, 103.0, [102.0, 103.0])
    assert t.ttft == 1.0 and t.tpot == 1.0
    assert scaled.warmup_end == 102.0
    assert (scaled.config.warmup_s, scaled.config.duration_s) == (2.0, 10.0)
    assert scaled.loadgen == result.loadgen  # CPU per wall second stays wall


def test_model_time_gives_the_open_loop_rate_in_simulated_requests_per_second() -> None:
    config = LoadConfig(rate=2.5, duration_s=40.0)
    result = RunResult(config, [], started=0.0, warmup_end=0.0, wall_s=40.0, sent=0, incomplete=0,
                       loadgen=LoadgenUsage(0.0, 40.0, 0), max_schedule_lag_s=0.0)  # fmt: skip
    scaled = to_model_time(result, 4.0, warmup_s=0.0, duration_s=10.0)
    assert scaled.config.rate == 10.0
    assert scaled.to_record(policy="p", workload="w").rate == 10.0
    same = to_model_time(result, 1.0, warmup_s=1.0, duration_s=40.0)
    assert (same.config.rate, same.config.warmup_s) == (2.5, 1.0)


# --- end to end -----------------------------------------------------------------------------------


def _bench(out: Path, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "gateway.cli",
        "bench",
        "--preset",
        "tiny",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]
    # As a terminal starts it: SIGINT at its default. A process started with SIGINT ignored (a
    # background job of a non-interactive shell, and so the pytest workers it starts) passes that on
    # to its children, and Python then keeps ignoring it: Ctrl-C would not reach the bench at all.
    return subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_sigint_default
    )


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "State:\tZ" in status  # a zombie has exited; its parent (init) reaps it


def _not_listening(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, int(port))) != 0


def _served(urls: list[str]) -> float:
    """Requests the fleet has finished so far (`vllm:request_success_total` over its replicas)."""
    total = 0.0
    for url in urls:
        text = httpx.get(url + "/metrics", timeout=10.0).text
        total += sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                     if s.name == "vllm:request_success_total")
    return total


def _children_gone(meta: dict[str, Any]) -> None:
    children = meta["children"]
    pids = [children["simulator"], *children["gateways"].values()]
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), pids
    assert all(_not_listening(u) for u in meta["replica_urls"])


@pytest.mark.timeout(90)
def test_tiny_bench_writes_results_summary_and_plots_and_leaves_no_children(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _bench(out)
    _, stderr = proc.communicate(timeout=80)
    assert proc.returncode == 0, stderr.decode()
    doc = load_results(out / "results.json")  # validated against the schema
    meta, runs = doc["meta"], doc["runs"]
    assert [(r["policy"], r["workload"], r["concurrency"]) for r in runs] == [
        ("round-robin", "random", 2),
        ("default", "random", 2),
    ]
    for r in runs:
        assert r["completed"] == r["requests"] == 8 and r["errors"] == 0
        assert r["clock"] == "simulated" and r["sim_steps"] > 0 and r["gateway_index_keys"] is not None
        # Both policies send the same unique prompts. Without the reset between them the second
        # would find every full block of every prompt cached.
        assert r["prefix_hit_rate"] == 0.0 and r["cached_token_fraction"] == 0.0
    assert [c["policy"] for c in meta["cache_resets"]] == ["round-robin", "default"]
    assert meta["complete"] is True and meta["simulator_profile"] == "tiny" and meta["fleet_size"] == 2
    assert meta["command"].startswith("kvgate bench --preset tiny")
    assert meta["process_layout"]["note"] and meta["workloads"][0]["workload"] == "random"
    summary = (out / "summary.md").read_text()
    assert "## random (closed loop)" in summary and "## Comparisons" in summary and "## Setting" in summary
    plots = sorted(p.name for p in out.glob("*.png"))
    assert plots == ["random-closed-goodput.png", "random-closed-tpot_p90.png", "random-closed-ttft_p90.png"]
    assert all((out / p).stat().st_size > 1000 for p in plots)
    # Each gateway's access log is kept beside its log: one line per request (warm-up included).
    for policy in ("round-robin", "default"):
        lines = (out / "logs" / f"access-random-{policy}.log").read_text().splitlines()
        assert sum('"status": 200' in line or '"status":200' in line for line in lines) >= 8, lines[:3]
    # The latency model's errors over each point's streams, found in its access log by request id.
    for r in runs:
        err = r["gateway_ttft_prediction_error"]
        assert 0 < err["n"] <= 8 and 0 <= err["p50"] <= err["p90"], err
    _children_gone(meta)


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_stops_the_children_and_keeps_partial_results(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    out = tmp_path / "out"
    proc = _bench(out, "--requests", "400", "--concurrency", "1", "--policies", "default")
    results = out / "results.json"
    deadline = time.monotonic() + 60
    meta: dict[str, Any] = {}
    while time.monotonic() < deadline and proc.poll() is None:
        if results.exists():
            with_gateway = orjson.loads(results.read_bytes())["meta"]
            if with_gateway.get("children", {}).get("gateways"):
                meta = with_gateway
                break
        time.sleep(0.1)
    assert meta, "the bench never started a gateway"
    # Into the load point (the only one; no warm-up): wait until the fleet has served a request
    # through the gateway, however slowly the loaded machine gets there.
    while proc.poll() is None and _served(meta["replica_urls"]) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None and _served(meta["replica_urls"]) > 0, "no request served"
    os.kill(proc.pid, sig)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == code, stderr.decode()
    doc = load_results(results)
    assert doc["meta"]["complete"] is False
    _children_gone(doc["meta"])


def test_the_latency_gate_flags_reach_the_gateway_config_with_the_profiles_prior() -> None:
    preset, _ = resolve(_args("--out", "x", "--predicted-admission", "on", "--knee-factor", "3"))
    assert preset.flow_control == {"predicted_admission": True, "knee_factor": 3.0}
    workload = build_workload(preset.workloads[1], preset.fleet, requests=4, seed=0)
    data = gateway_config(
        "default", ["http://127.0.0.1:9001"], "llama-3-8b", preset=preset, workload=workload, port=1
    )
    config = parse_config(data)
    assert config.flow_control.predicted_admission and config.flow_control.knee_factor == 3.0
    prior = config.models[0].latency_prior
    assert prior is not None and prior.profile == preset.fleet.profile
    assert prior.time_scale == preset.fleet.time_scale
    untouched, _ = resolve(_args("--out", "x"))
    assert untouched.flow_control == {}
    # Without the flags the gate is kvgate's default, and the pool still starts from the fleet's speed.
    plain = parse_config(gateway_config(
        "default", ["http://127.0.0.1:9001"], "llama-3-8b", preset=untouched, workload=workload, port=1
    ))
    assert plain.flow_control.predicted_admission  # kvgate's default
    plain_prior = plain.models[0].latency_prior
    assert plain_prior is not None and plain_prior.profile == untouched.fleet.profile


def test_the_light_tenant_flags_reach_the_gateway_config() -> None:
    preset, _ = resolve(_args("--out", "x", "--light-knee-factor", "2", "--light-reserve", "0"))
    assert preset.flow_control == {"light_knee_factor": 2.0, "light_reserve": 0}
    workload = build_workload(preset.workloads[1], preset.fleet, requests=4, seed=0)
    config = parse_config(gateway_config(
        "default", ["http://127.0.0.1:9001"], "llama-3-8b", preset=preset, workload=workload, port=1
    ))
    assert config.flow_control.light_knee_factor == 2.0 and config.flow_control.light_reserve == 0


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "partial results"),
        (b"{not json", "partial results"),
        (orjson.dumps({"meta": {"complete": False}, "runs": []}), "partial results"),
        (orjson.dumps({"meta": {"complete": True}, "runs": []}), "are complete; the summary and plots"),
    ],
)
def test_an_interrupt_says_whether_the_results_were_already_complete(
    tmp_path: Path, content: bytes | None, says: str
) -> None:
    # Ctrl-C while the summary's plots are drawn comes after results.json was written complete.
    if content is not None:
        (tmp_path / "results.json").write_bytes(content)
    assert says in _left_behind(tmp_path)
