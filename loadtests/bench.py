"""`kvgate bench`: routing policies compared side by side on one simulated fleet.

`run_bench(preset, out_dir, command=...)` runs a `BenchPreset` (see `loadtests.presets`):

1. starts the simulated fleet, one `kvgate sim` child, pinned per `bench_processes.choose_layout`;
2. for each workload (one seeded request stream, the same for every policy) and each policy:
   - waits until every replica is idle and empties every replica's prefix cache, so that each
     policy starts cold on the same fleet;
   - starts a fresh `kvgate serve` child (`scheduling.profile: <policy>`, the fleet's replicas, a
     fresh prefix index), or none for `direct` (load straight to the first replica);
   - sends the warm-up requests (unmeasured), then each load point's slice of the stream, in sweep
     order: the same slices, hence the same prompts, for every policy;
   - per load point: scrapes the fleet's counters before and after (prefix hit rate = fleet
     Δhits / Δqueries; preemptions), the simulator's own step lag, and the gateway's and the
     simulator's CPU; makes the runner's record, adds those figures, validates it, appends it, and
     rewrites `results.json` (an interrupted run keeps what it measured);
   - stops the gateway;
3. writes `results.json`, `summary.md` (the report's tables and knees, then the policy comparisons
   and the simulator's distortion per run) and the PNG plots.

Clock: the simulator runs `time_scale` times slower than the GPUs it models. Every latency, duration
and rate in the results is in SIMULATED seconds (wall / time_scale), so TTFT and goodput read as on
the modelled hardware and SLOs are given in those terms. What does not scale is the real CPU work on
the path (gateway, HTTP): it is divided by the time scale too, so the gateway's overhead appears
`time_scale` times smaller than it is (`loadtests/overhead_bench.py` measures it in wall time).
Extra record fields (beyond `loadtests.results`): `clock`, `requests_offered`, `sent`, `wall_s`,
`warmup_errors` (failures among the unmeasured warm-up requests of the point), `sim_*` (the
simulator's steps, step lag in wall seconds, clock jumps in simulated seconds, CPU in cores, and
`sim_distorted`), `gateway_*` (CPU, RSS, prefix-index keys, queued and rejected admissions, and
`gateway_ttft_prediction_error`: n, p50 and p90 of the latency model's |predicted - actual| / actual
TTFT over the point's measured streams (after its warm-up) it scored, read from the gateway's access
log by request id).

Interrupts: Ctrl-C or SIGTERM cancel the run; the children are stopped (gateway, then fleet) and the
records measured so far are written.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from loadtests import bench_fleet
from loadtests.access_log import ttft_errors
from loadtests.bench_processes import (
    GatewayProcess,
    ProcessLayout,
    SimFleetProcess,
    choose_layout,
    cpu_seconds,
    pin_self,
    rss_bytes,
)
from loadtests.bench_summary import write_summary
from loadtests.measures import RequestTrace, fleet_delta, measured, prediction_errors
from loadtests.ports import free_port
from loadtests.presets import DIRECT, BenchPreset
from loadtests.results import make_meta, validate_record, write_results
from loadtests.runner import LoadConfig, RunResult, run_load, scrape_counters
from loadtests.slo import Slo, parse_slo
from loadtests.workload_factory import WorkloadPlan, build_workload
from loadtests.workloads.noisy_neighbour import NoisyNeighbourWorkload
from loadtests.workloads.spec import RequestSpec, Workload

CLOCK = "simulated"
DISTORTED_JUMP_SHARE = 0.02
"""A run is flagged `sim_distorted` when the simulator's engine clocks skipped more than this share of
the replicas' measured simulated time (the simulator fell behind: its latencies are stretched)."""


@dataclass(frozen=True, slots=True)
class BenchOutcome:
    """Where the run wrote (`results`, `summary`, `plots`) and how many records it made; `complete`
    is False when it was interrupted (the files hold what was measured)."""

    results: Path
    summary: Path | None
    plots: tuple[Path, ...]
    records: int
    complete: bool


# --- pure helpers ---------------------------------------------------------------------------------


def to_model_time(result: RunResult, time_scale: float, *, warmup_s: float, duration_s: float) -> RunResult:
    """`result` with every trace time mapped to simulated seconds: t -> start + (t - start) / scale,
    and the load config's warm-up, duration and open-loop rate given in simulated terms."""
    if time_scale == 1.0:
        return dataclasses.replace(
            result, config=dataclasses.replace(result.config, warmup_s=warmup_s, duration_s=duration_s)
        )
    t0, k = result.started, 1.0 / time_scale

    def scaled(t: RequestTrace) -> RequestTrace:
        return dataclasses.replace(
            t,
            start=t0 + (t.start - t0) * k,
            first_token=None if t.first_token is None else t0 + (t.first_token - t0) * k,
            end=t0 + (t.end - t0) * k,
            chunk_times=[t0 + (c - t0) * k for c in t.chunk_times],
        )

    return dataclasses.replace(
        result,
        traces=[scaled(t) for t in result.traces],
        warmup_end=t0 + (result.warmup_end - t0) * k,
        config=dataclasses.replace(
            result.config,
            warmup_s=warmup_s,
            duration_s=duration_s,
            rate=None if result.config.rate is None else result.config.rate * time_scale,
        ),
    )


def gateway_config(
    policy: str,
    urls: Sequence[str],
    model: str,
    *,
    preset: BenchPreset,
    workload: Workload,
    port: int,
) -> dict[str, Any]:
    """The generated `kvgate serve` config for one policy on this fleet (plain YAML-ready data).

    Timeouts and flow-control waits are the gateway's defaults stretched by the time scale, so that
    they mean the same in simulated time; scraping keeps its wall-clock interval. Health checks are
    relaxed (2 s timeouts, 3 failures to eject, metrics stale after 3 s): on a shared machine the
    simulator process is sometimes not scheduled for a second or more, and the default checks would
    eject the whole fleet and turn that stall into a burst of 503s; the stall is measured instead
    (`sim_clock_jump_s`, `sim_distorted`)."""
    scale = preset.fleet.time_scale
    config: dict[str, Any] = {
        # No load balancer to tell: the bench stops a gateway after its load, so no drain propagation.
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning", "drain_propagation_s": 0.0},
        "models": [{"name": model, "tokenizer": preset.gateway_tokenizer}],
        "replicas": [{"url": u, "model": model, "name": f"r{i}"} for i, u in enumerate(urls)],
        "upstream": {
            "first_byte_timeout_s": max(60.0, 60.0 * scale),
            "chunk_timeout_s": max(30.0, 30.0 * scale),
        },
        "fleet": {
            "scrape_timeout_s": 2.0,
            "health_timeout_s": 2.0,
            "eject_after_failures": 3,
            "stale_after_s": 3.0,
        },
        "scheduling": {"profile": policy, "seed": preset.seed},
        "flow_control": {
            "bands": {
                "critical": {"max_wait_s": 30.0 * scale},
                "standard": {"max_wait_s": 10.0 * scale},
                "sheddable": {"max_wait_s": 0.0},
            }
        },
    }
    # The simulated fleet's own speed is the pool's latency prior: the latency gate (on by default)
    # and the predicted-latency profile start from it instead of the generic default prior.
    config["models"][0]["latency_prior"] = {"profile": preset.fleet.profile, "time_scale": scale}
    if preset.flow_control:  # the latency gate's settings
        config["flow_control"].update(preset.flow_control)
    if preset.profiles:
        config["scheduling"]["profiles"] = {name: dict(spec) for name, spec in preset.profiles.items()}
    if isinstance(workload, NoisyNeighbourWorkload):
        from gateway.auth_keys import hash_key

        config["tenants"] = [{"name": t.name, "api_keys": [hash_key(t.key())]} for t in workload.tenants]
    return config


def kvgate_commit(repo: Path) -> str | None:
    """`git rev-parse HEAD` of `repo`, with `+dirty` when the work tree has changes; None without git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


# --- the run --------------------------------------------------------------------------------------


class _Bench:
    """One bench run in progress; owned by `run_bench`."""

    def __init__(self, preset: BenchPreset, plans: Sequence[WorkloadPlan], out_dir: Path, command: str,
                 layout: ProcessLayout, progress: bool) -> None:  # fmt: skip
        self.preset = preset
        self.plans = list(plans)
        self.out_dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        self.layout = layout
        self.slo: Slo = parse_slo(preset.slo)
        self.records: list[dict[str, Any]] = []
        self.workloads: list[tuple[WorkloadPlan, Workload, list[RequestSpec]]] = []
        self.notes: list[str] = list(preset.notes)
        self.resets: list[dict[str, Any]] = []
        self._started = time.time()
        self.meta: dict[str, Any] = {}
        self._progress = progress
        self._command = command
        self._bar: Any = None

    def build_workloads(self) -> None:
        for plan in self.plans:
            total = self.preset.total_requests(plan)
            workload = build_workload(plan, self.preset.fleet, requests=total, seed=self.preset.seed)
            specs = list(workload.requests())[:total]
            self.workloads.append((plan, workload, specs))

    def make_meta(self) -> None:
        p = self.preset
        self.meta = make_meta(
            command=self._command,
            slo=self.slo,
            simulator_profile=p.fleet.profile,
            time_scale=p.fleet.time_scale,
            fleet_size=p.fleet.replicas,
            kvgate_commit=kvgate_commit(Path(__file__).resolve().parents[1]),
            clock=f"{CLOCK}: latencies, durations and rates are in simulated seconds (wall / time_scale)",
            preset=p.name,
            fleet=p.fleet.describe(),
            kv_blocks=p.fleet.kv_blocks,
            process_layout=self.layout.as_meta(),
            policies=list(p.policies),
            profiles={k: dict(v) for k, v in p.profiles.items()},
            gateway_tokenizer=p.gateway_tokenizer,
            load_points=[
                {"mode": m, "load": x, "requests": p.point_requests(m, x)} for m, x in p.load_points()
            ],
            warmup_requests=p.warmup_requests,
            warmup_s=p.warmup_s,
            max_duration_s=p.max_duration_s,
            open_duration_s=p.open_duration_s,
            direct_points=p.direct_points,
            seed=p.seed,
            workloads=[
                {
                    **w.describe(),
                    "name": plan.name,
                    "policies": list(p.policies_for(plan)),
                    "warmup_requests": p.plan_warmup(plan),
                }
                for plan, w, _ in self.workloads
            ],
            notes=self.notes,
            cache_resets=self.resets,
        )

    def write(self, *, final: bool) -> BenchOutcome:
        self.meta["wall_s"] = round(time.time() - self._started, 1)
        self.meta["complete"] = final
        path = self.out_dir / "results.json"
        write_results(path, self.meta, self.records)
        if not final:
            return BenchOutcome(path, None, (), len(self.records), False)
        written = write_summary({"meta": self.meta, "runs": self.records}, self.out_dir, self.preset)
        summary = self.out_dir / "summary.md"
        return BenchOutcome(
            path, summary, tuple(p for p in written if p.suffix == ".png"), len(self.records), True
        )

    async def run(self) -> None:
        p = self.preset
        total = sum(
            p.warmup_for(policy, plan) + sum(n for _, _, n, _ in p.points_for(policy, plan))
            for plan, _, _ in self.workloads
            for policy in p.policies_for(plan)
        )
        with self._progress_bar(total) as bar:
            self._bar = bar
            fleet = SimFleetProcess(p.fleet.sim_args(), p.fleet.replicas, self.layout.sim_cpus,
                                    self.out_dir / "logs" / "sim.log")  # fmt: skip
            with fleet:
                self.meta["replica_urls"] = fleet.urls
                sim_pid = fleet.child.pid if fleet.child else None
                self.meta["children"] = {"simulator": sim_pid, "gateways": {}}
                self.write(final=False)
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as control:
                    for plan, workload, specs in self.workloads:
                        for policy in p.policies_for(plan):
                            await self._policy(control, fleet, plan, workload, specs, policy)

    @contextlib.contextmanager
    def _progress_bar(self, total: int) -> Any:
        if not self._progress:
            yield None
            return
        from tqdm import tqdm

        bar = tqdm(total=total, unit="req", dynamic_ncols=True, smoothing=0.1)
        try:
            yield bar
        finally:
            bar.close()

    def _tick(self, _trace: RequestTrace) -> None:
        if self._bar is not None:
            self._bar.update(1)

    async def _policy(self, control: aiohttp.ClientSession, fleet: SimFleetProcess, plan: WorkloadPlan,
                      workload: Workload, specs: list[RequestSpec], policy: str) -> None:  # fmt: skip
        p = self.preset
        attempts = await bench_fleet.reset_prefix_caches(control, fleet.urls)
        self.resets.append({"workload": plan.name, "policy": policy, "attempts": attempts})
        if self._bar is not None:
            self._bar.set_description(f"{plan.name} {policy}")
        if policy == DIRECT:
            await self._sweep(control, fleet, plan, specs, policy, fleet.urls[0], None)
            return
        config = gateway_config(
            policy, fleet.urls, p.fleet.model_name, preset=p, workload=workload, port=free_port()
        )
        slug = f"{plan.name}-{policy}"
        logs = self.out_dir / "logs"
        gateway = GatewayProcess(config, self.out_dir / "configs" / f"{slug}.yaml", self.layout.gateway_cpus,
                                 logs / f"gateway-{slug}.log",
                                 access_log=logs / f"access-{slug}.log")  # fmt: skip
        async with gateway:
            self.meta["children"]["gateways"][slug] = gateway.pid
            self.write(final=False)
            await self._sweep(control, fleet, plan, specs, policy, gateway.url, gateway)

    async def _sweep(self, control: aiohttp.ClientSession, fleet: SimFleetProcess, plan: WorkloadPlan,
                     specs: list[RequestSpec], policy: str, target: str,
                     gateway: GatewayProcess | None) -> None:  # fmt: skip
        p = self.preset
        scale = p.fleet.time_scale
        warmup = p.warmup_for(policy, plan)
        if warmup:
            warm = LoadConfig(
                concurrency=min(max(p.concurrency or (1,)), 2 * p.fleet.replicas),
                max_requests=warmup, duration_s=p.max_duration_s * scale,
                drain_timeout_s=p.drain_s * scale, request_timeout_s=(p.max_duration_s + p.drain_s) * scale,
                seed=p.seed,
            )  # fmt: skip
            await run_load(target, specs[:warmup], warm, on_done=self._tick)
        for mode, load, n, offset in p.points_for(policy, plan):
            if self._bar is not None:
                self._bar.set_description(
                    f"{plan.name} {policy} {'c=' if mode == 'closed' else 'rate='}{load:g}"
                )
            duration = p.max_duration_s if mode == "closed" else p.open_duration_s
            config = LoadConfig(
                concurrency=int(load) if mode == "closed" else None,
                rate=load / scale if mode == "open" else None,
                max_requests=n, duration_s=duration * scale, warmup_s=p.warmup_s * scale,
                drain_timeout_s=p.drain_s * scale, request_timeout_s=(p.max_duration_s + p.drain_s) * scale,
                seed=p.seed,
            )  # fmt: skip
            record = await self._point(control, fleet, plan, specs[offset : offset + n], policy, target,
                                       gateway, config, duration)  # fmt: skip
            self.records.append(record)
            self.write(final=False)

    async def _point(self, control: aiohttp.ClientSession, fleet: SimFleetProcess, plan: WorkloadPlan,
                     specs: list[RequestSpec], policy: str, target: str, gateway: GatewayProcess | None,
                     config: LoadConfig, duration_s: float) -> dict[str, Any]:  # fmt: skip
        p = self.preset
        urls = fleet.urls
        sim_pid = fleet.child.pid if fleet.child is not None else None
        gw_pid = gateway.pid if gateway is not None else None
        counters0 = await scrape_counters(control, urls)
        health0 = await bench_fleet.scrape_sim_health(control, urls)
        gauges0 = await bench_fleet.scrape_gateway_gauges(control, gateway.url) if gateway else None
        sim_cpu0 = cpu_seconds(sim_pid) if sim_pid else 0.0
        gw_cpu0 = cpu_seconds(gw_pid) if gw_pid else 0.0
        wall0 = time.perf_counter()
        result = await run_load(target, specs, config, on_done=self._tick)
        wall = time.perf_counter() - wall0
        sim_cpu = (cpu_seconds(sim_pid) - sim_cpu0) if sim_pid else 0.0
        gw_cpu = (cpu_seconds(gw_pid) - gw_cpu0) if gw_pid else 0.0
        counters1 = await scrape_counters(control, urls)
        health1 = await bench_fleet.scrape_sim_health(control, urls)
        gauges1 = await bench_fleet.scrape_gateway_gauges(control, gateway.url) if gateway else None
        scale = p.fleet.time_scale
        modelled = to_model_time(result, scale, warmup_s=p.warmup_s, duration_s=duration_s)
        record = modelled.to_record(
            policy=policy, workload=plan.name, slo=self.slo, fleet=fleet_delta(counters0, counters1)
        ).as_dict()
        health = bench_fleet.sim_health_delta(health0, health1)
        replica_s = p.fleet.replicas * modelled.summarize().duration_s
        record.update(
            warmup_errors=sum(1 for t in modelled.traces if t.start < modelled.warmup_end and not t.ok),
            clock=CLOCK,
            requests_offered=len(specs),
            sent=result.sent,
            wall_s=wall,
            sim_steps=health.steps,
            sim_step_lag_mean_s=health.lag_mean_s,
            sim_step_lag_p99_s=health.lag_p99_s,
            sim_clock_jump_s=health.clock_jump_s,
            sim_distorted=health.clock_jump_s > DISTORTED_JUMP_SHARE * replica_s,
            sim_cpu_frac=sim_cpu / wall if wall > 0 else 0.0,
            gateway_cpu_frac=(gw_cpu / wall if wall > 0 else 0.0) if gateway else None,
            gateway_cpu_ms_per_request=(1e3 * gw_cpu / result.sent if result.sent else 0.0)
            if gateway
            else None,
            gateway_rss_bytes=rss_bytes(gw_pid) if gw_pid else None,
            gateway_index_keys=gauges1.index_keys if gauges1 else None,
            gateway_queued=(gauges1.queued - gauges0.queued) if gauges0 and gauges1 else None,
            gateway_rejected=(gauges1.rejected - gauges0.rejected) if gauges0 and gauges1 else None,
        )
        if gateway is not None and gateway.access_log is not None:
            ids = {t.request_id for t in measured(result.traces, result.warmup_end)}
            record["gateway_ttft_prediction_error"] = prediction_errors(ttft_errors(gateway.access_log, ids))
        validate_record(record)
        return record


async def run_bench(
    preset: BenchPreset,
    plans: Sequence[WorkloadPlan],
    out_dir: Path,
    *,
    command: str,
    pin: bool = True,
    progress: bool = True,
) -> BenchOutcome:
    """Run the benchmark (module docstring) and write `out_dir`. On cancellation (Ctrl-C, SIGTERM via
    `main`) the children are stopped, the records so far written, and CancelledError re-raised."""
    layout = choose_layout(sorted(os.sched_getaffinity(0)), pin=pin)
    bench = _Bench(preset, plans, out_dir, command, layout, progress)
    bench.build_workloads()
    bench.make_meta()
    pin_self(layout.loadgen_cpus)
    try:
        await bench.run()
    except BaseException:
        bench.write(final=False)
        raise
    return bench.write(final=True)


def run_bench_sync(preset: BenchPreset, plans: Sequence[WorkloadPlan], out_dir: Path, *, command: str,
                   pin: bool = True, progress: bool = True) -> BenchOutcome:  # fmt: skip
    """`run_bench` in a fresh event loop (uvloop when installed). SIGTERM cancels it (CancelledError)
    as Ctrl-C does (KeyboardInterrupt), both after the children are stopped and the records written."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        factory = None

    async def main() -> BenchOutcome:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await run_bench(preset, plans, out_dir, command=command, pin=pin, progress=progress)

    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())
