"""`python -m loadtests.des_agreement`: does the what-if mode agree with a live run on a small case?

Runs one shared-prefix load point twice per policy and prints the two side by side:

- live: a `kvgate sim` fleet and a `kvgate serve` gateway as child processes on loopback, and the
  live load generator (`loadtests.runner.run_load`) in this process. On a machine with 2+ cores the
  simulator gets a core of its own and the gateway shares the other with this process (`taskset`), as
  `kvgate bench` lays them out. Each policy gets a fresh fleet (cold caches) and a fresh gateway.
  Client-side times are wall seconds; they are divided by the time scale to compare them with the
  simulated seconds of the engine model.
- DES: the same workload, load and gateway config through `loadtests.des.run_des`, with the gateway's
  scrape interval and staleness limit (wall seconds live) divided by the time scale too, so the
  gateway sees the same staleness in simulated time.

The default case is the `kvgate bench` quick preset's fleet (4 x llama-3-8b-h100 with 2,048 KV blocks
of 16 tokens per replica, a stated shrink of the real ~25.7k) at time scale 10, the scale
`docs/benchmarks.md` measured as faithful for these profiles, closed loop at concurrency 16. The
live gateway runs with flow control off: admission is not modelled by the DES (see
`loadtests.des.gateway_model`), and this checks the routing and the engine model.

The comparison table lists TTFT p50/p90, TPOT p50, E2E p50 (simulated seconds) and the fleet's prefix
hit rate, and flags a difference above `--tolerance` (15%); the exit status is 1 when TTFT p50 or the
hit rate is off. The live simulator's own distortion (mean step lag in wall ms, clock jumps in
simulated s) is printed with it: when that is large, the live side is the one that is off.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from loadtests.des import DesConfig, FleetSpec, run_des
from loadtests.measures import LatencyStats, Measures, RequestTrace, fleet_delta, summarize
from loadtests.ports import free_port
from loadtests.runner import LoadConfig, run_load, scrape_counters
from loadtests.workload_factory import WorkloadPlan, build_workload
from loadtests.workloads import SharedPrefixWorkload, Workload
from loadtests.workloads.spec import RequestSpec
from simulator.engine import EngineConfig


@dataclass(frozen=True, slots=True)
class Case:
    """The small case: fleet, workload (tokens) and load. `time_scale` is wall s per simulated s."""

    replicas: int = 4
    profile: str = "llama-3-8b-h100"
    kv_blocks: int = 2048
    time_scale: float = 10.0
    system_prompt_tokens: int = 2048
    question_tokens: int = 256
    output_tokens: int = 32
    requests: int = 320
    concurrency: int = 16
    seed: int = 0
    scrape_interval_s: float = 0.2  # wall, the gateway's default
    stale_after_s: float = 1.0  # wall, the gateway's default

    def fleet(self) -> FleetSpec:
        return FleetSpec(replicas=self.replicas, profile=self.profile,
                         engine=EngineConfig(num_gpu_blocks=self.kv_blocks))  # fmt: skip

    def workload(self) -> Workload:
        plan = WorkloadPlan(SharedPrefixWorkload.name, {
            "system_prompt_tokens": self.system_prompt_tokens, "question_tokens": self.question_tokens,
            "output_tokens": self.output_tokens,
        })  # fmt: skip
        return build_workload(plan, self.fleet(), requests=self.requests, seed=self.seed)

    def gateway_config(self, policy: str) -> dict[str, Any]:
        """The live gateway's config without replicas (the DES uses it as its base too)."""
        scale = self.time_scale
        return {
            "server": {"host": "127.0.0.1", "log_level": "warning"},
            "models": [{"name": self.fleet().model_name, "tokenizer": "none"}],
            # Scrape timing as the gateway's defaults (the DES mirrors it); timeouts and ejection
            # relaxed so that a CPU hiccup on this shared machine cannot eject a replica mid-run.
            "fleet": {"scrape_interval_s": self.scrape_interval_s, "stale_after_s": self.stale_after_s,
                      "scrape_timeout_s": 5.0, "health_timeout_s": 5.0, "eject_after_failures": 10},
            "upstream": {"first_byte_timeout_s": 60.0 * scale, "chunk_timeout_s": 30.0 * scale},
            "scheduling": {"profile": policy, "seed": self.seed},
            "flow_control": {"enabled": False},
        }


@dataclass(frozen=True, slots=True)
class Side:
    """One side's figures, in simulated seconds; `extra` holds side-specific notes."""

    ttft: LatencyStats
    tpot: LatencyStats
    e2e: LatencyStats
    hit_rate: float | None
    completed: int
    errors: int
    extra: dict[str, float]


def _side(measures: Measures, hit_rate: float | None, **extra: float) -> Side:
    return Side(measures.ttft, measures.tpot, measures.e2e, hit_rate, measures.completed, measures.errors,
                dict(extra))  # fmt: skip


# --- the DES side ---------------------------------------------------------------------------------


def des_side(case: Case, policy: str, specs: Sequence[RequestSpec]) -> Side:
    config = DesConfig(case.fleet(), policy=policy, gateway=case.gateway_config(policy),
                       scrape_interval_s=case.scrape_interval_s / case.time_scale,
                       stale_after_s=case.stale_after_s / case.time_scale, seed=case.seed,
                       record_chunks=True)  # fmt: skip
    result = run_des(specs, config, _load(case, 1.0))
    return _side(result.summarize(), result.fleet.prefix_hit_rate, wall_s=result.wall_s, events=result.events)


def _load(case: Case, scale: float) -> LoadConfig:
    """The load point, its bounds in wall seconds at time scale `scale` (1: simulated seconds)."""
    return LoadConfig(concurrency=case.concurrency, max_requests=case.requests, duration_s=3600.0 * scale,
                      drain_timeout_s=600.0 * scale, request_timeout_s=600.0 * scale,
                      seed=case.seed)  # fmt: skip


# --- the live side --------------------------------------------------------------------------------


class _Child:
    """A `python -m gateway.cli ...` child (optionally pinned), stderr to a log file; `stop()` always."""

    def __init__(self, args: Sequence[str], cpus: str | None, log: Path, *, stdout: bool = False) -> None:
        pin = ["taskset", "-c", cpus] if cpus else []
        self._log: IO[bytes] = log.open("ab")
        self.log_path = log
        self.proc = subprocess.Popen(
            [*pin, sys.executable, "-m", "gateway.cli", *args], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout else subprocess.DEVNULL, stderr=self._log,
            start_new_session=True,
        )  # fmt: skip

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


def _layout() -> tuple[str | None, str | None]:
    """(simulator CPUs, gateway + load generator CPUs) for taskset, or None each when not pinning."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or shutil.which("taskset") is None:
        return None, None
    return str(cpus[0]), ",".join(map(str, cpus[1:]))


async def _read_urls(child: _Child, n: int, timeout_s: float = 60.0) -> list[str]:
    assert child.proc.stdout is not None
    urls: list[str] = []
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + timeout_s
    while len(urls) < n:
        if time.monotonic() > deadline or child.proc.poll() is not None:
            raise RuntimeError(f"kvgate sim did not start; see {child.log_path}")
        line = await loop.run_in_executor(None, child.proc.stdout.readline)
        if line.startswith(b"http"):
            urls.append(line.decode().strip())
    return urls


async def _wait_ready(
    session: aiohttp.ClientSession, url: str, child: _Child, timeout_s: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            raise RuntimeError(f"kvgate serve exited; see {child.log_path}")
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url + "/ready") as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"kvgate serve not ready in {timeout_s:g}s; see {child.log_path}")


async def _sim_distortion(session: aiohttp.ClientSession, urls: Sequence[str]) -> tuple[float, float, float]:
    """(steps, summed step lag in wall s, clock jumps in simulated s) over the fleet, from `/metrics`."""
    steps = lag = jumps = 0.0
    for url in urls:
        async with session.get(url + "/metrics") as resp:
            text = await resp.text()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "kvgate_sim_step_lag_seconds_count":
                    steps += s.value
                elif s.name == "kvgate_sim_step_lag_seconds_sum":
                    lag += s.value
                elif s.name == "kvgate_sim_clock_jump_seconds_total":
                    jumps += s.value
    return steps, lag, jumps


def _to_simulated(traces: Sequence[RequestTrace], t0: float, scale: float) -> list[RequestTrace]:
    def f(t: float) -> float:
        return (t - t0) / scale

    return [
        RequestTrace(
            request_id=t.request_id, tenant=t.tenant, group=t.group, start=f(t.start),
            first_token=None if t.first_token is None else f(t.first_token), end=f(t.end),
            chunk_times=[f(c) for c in t.chunk_times], output_tokens=t.output_tokens,
            prompt_tokens=t.prompt_tokens, cached_tokens=t.cached_tokens, status=t.status, error=t.error,
            replica=t.replica,
        )
        for t in traces
    ]


async def live_side(case: Case, policy: str, specs: Sequence[RequestSpec], workdir: Path) -> Side:
    sim_cpus, rest_cpus = _layout()
    affinity = os.sched_getaffinity(0)
    fleet = case.fleet()
    sim = _Child(["sim", "--replicas", str(case.replicas), "--port", "0", "--profile", case.profile,
                  "--time-scale", repr(case.time_scale), "--kv-blocks", str(case.kv_blocks)],
                 sim_cpus, workdir / f"sim-{policy}.log", stdout=True)  # fmt: skip
    gateway: _Child | None = None
    try:
        urls = await _read_urls(sim, case.replicas)
        port = free_port()
        config = case.gateway_config(policy)
        config["server"]["port"] = port
        config["replicas"] = [
            {"url": u, "model": fleet.model_name, "name": f"r{i}"} for i, u in enumerate(urls)
        ]
        path = workdir / f"gateway-{policy}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        gateway = _Child(["serve", "--config", str(path)], rest_cpus, workdir / f"gateway-{policy}.log")
        if rest_cpus:
            os.sched_setaffinity(0, {int(c) for c in rest_cpus.split(",")})  # off the simulator's core
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as control:
            await _wait_ready(control, url, gateway)
            before = await scrape_counters(control, urls)
            distortion0 = await _sim_distortion(control, urls)
            result = await run_load(url, specs, _load(case, case.time_scale))
            after = await scrape_counters(control, urls)
            distortion1 = await _sim_distortion(control, urls)
        steps, lag, jumps = (b - a for a, b in zip(distortion0, distortion1, strict=True))
        traces = _to_simulated(result.traces, result.started, case.time_scale)
        measures = summarize(traces, warmup_end=0.0)
        failed = [t.error or str(t.status) for t in traces if not t.ok]
        if failed:
            print(f"live {policy}: {len(failed)} requests failed, first: {failed[0]}", file=sys.stderr)
        return _side(measures, fleet_delta(before, after).prefix_hit_rate, wall_s=result.wall_s,
                     loadgen_cpu=result.loadgen.cpu_frac,
                     step_lag_mean_ms=1e3 * lag / steps if steps else 0.0, clock_jumps_s=jumps)  # fmt: skip
    finally:
        os.sched_setaffinity(0, affinity)
        if gateway is not None:
            gateway.stop()
        sim.stop()


# --- comparison -----------------------------------------------------------------------------------


REQUIRED = ("TTFT p50 (s)", "prefix hit rate")
"""The rows that must agree (issue #5); the others are shown for context."""

ROWS: tuple[tuple[str, str], ...] = (
    ("TTFT p50 (s)", "ttft.p50"), ("TTFT p90 (s)", "ttft.p90"), ("TPOT p50 (s)", "tpot.p50"),
    ("E2E p50 (s)", "e2e.p50"), ("prefix hit rate", "hit_rate"),
)  # fmt: skip


def _value(side: Side, path: str) -> float | None:
    if path == "hit_rate":
        return side.hit_rate
    stats, field = path.split(".")
    value: float | None = getattr(getattr(side, stats), field)
    return value


Row = tuple[str, float | None, float | None, float | None, bool]


def compare(live: Side, des: Side, tolerance: float) -> list[Row]:
    """(row, live, DES, relative difference (DES - live) / live, within tolerance) per row."""
    out = []
    for label, path in ROWS:
        a, b = _value(live, path), _value(des, path)
        diff = 0.0 if a == b else (b - a) / a if a and b is not None else None
        out.append((label, a, b, diff, diff is not None and abs(diff) <= tolerance))
    return out


def table(policy: str, rows: Sequence[Row], live: Side, des: Side) -> str:
    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.4f}"

    lines = [f"### {policy}", "", "| measure | live | DES | DES vs live | |", "|---|---|---|---|---|"]
    for label, a, b, diff, ok in rows:
        lines.append(f"| {label} | {num(a)} | {num(b)} | {'-' if diff is None else f'{diff:+.1%}'} | "
                     f"{'ok' if ok else 'OFF'} |")  # fmt: skip
    lines.append("")
    lines.append(f"live: {live.completed} ok, {live.errors} errors, "
                 + ", ".join(f"{k} {v:.3g}" for k, v in live.extra.items()))
    lines.append(f"DES: {des.completed} ok, {des.errors} errors, "
                 + ", ".join(f"{k} {v:.3g}" for k, v in des.extra.items()))
    return "\n".join(lines) + "\n"


async def run(case: Case, policies: Sequence[str], tolerance: float, workdir: Path) -> dict[str, Any]:
    specs = list(case.workload().requests())[: case.requests]
    report: dict[str, Any] = {"case": _asdict(case), "policies": {}}
    for policy in policies:
        des = des_side(case, policy, specs)
        live = await live_side(case, policy, specs, workdir)
        rows = compare(live, des, tolerance)
        print(table(policy, rows, live, des), flush=True)
        report["policies"][policy] = {
            "rows": [{"measure": r[0], "live": r[1], "des": r[2], "diff": r[3], "ok": r[4]} for r in rows],
            "live": live.extra, "des": des.extra,
        }  # fmt: skip
    return report


def _asdict(case: Case) -> dict[str, Any]:
    return {name: getattr(case, name) for name in Case.__dataclass_fields__}


def main(argv: Sequence[str] | None = None) -> int:
    summary = __doc__.split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m loadtests.des_agreement", description=summary)
    defaults = Case()
    for name in Case.__dataclass_fields__:
        value = getattr(defaults, name)
        p.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    p.add_argument("--policies", default="default,round-robin")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--json", type=Path, default=None, help="also write the comparison here")
    p.add_argument("--workdir", type=Path, default=None, help="keep the children's configs and logs here")
    args = p.parse_args(argv)
    case = Case(**{name: getattr(args, name) for name in Case.__dataclass_fields__})
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        report = asyncio.run(run(case, policies, args.tolerance, args.workdir))
    else:
        with tempfile.TemporaryDirectory(prefix="des-agreement-") as tmp:
            report = asyncio.run(run(case, policies, args.tolerance, Path(tmp)))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    ok = all(r["ok"] for v in report["policies"].values() for r in v["rows"] if r["measure"] in REQUIRED)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
