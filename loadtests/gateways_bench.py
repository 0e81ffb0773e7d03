"""`python -m loadtests.gateways_bench`: hit rate, goodput and TTFT vs the number of live gateway processes.

The live counterpart of `loadtests.des_gateways` (docs/benchmarks.md, "Hit rate and goodput vs number
of gateways"): one simulated fleet (`kvgate sim --kv-events-port 0`, every replica publishing vLLM's
KV-cache events) and, per cell, a fresh `kvgate serve --workers N` on one port (N processes, limits
shared through a private `redis-server`), for each workload, index and N and seed:

- index `approximate`: the replicas without `kv_events` in the gateway's config: each worker keeps its
  own approximate index, learnt from its own dispatches;
- index `exact`: the same replicas with their `kv_events` / `kv_events_replay` endpoints: every worker
  subscribes and routes on the exact index the events build.

Both use the `sim` tokenizer (token-block keys for the approximate index too), so the index is the
only difference; the profile is the built-in `default`. Each cell:

1. empties every replica's prefix cache (`bench_fleet.reset_prefix_caches`, the gateway stopped);
2. starts the gateway and waits until `/ready` answers and N sockets listen on the port;
3. primes every replica with one short request sent straight to it (so that every engine has
   published a batch: a replica's exact mode starts only with its first event), then waits until the
   gateway's `kvgate_prefix_index_mode` says exact for every replica (the merge over workers takes the
   minimum: exact only when every worker's picture is) or, for `approximate`, reads that it is not;
4. sends the workload's warm-up requests through the gateway (unmeasured), then the measured slice,
   closed loop, scraping the replicas' own prefix-cache counters before and after (hit rate = fleet
   Δhits / Δqueries, as `kvgate bench` does), the simulator's step lag and the CPU of the simulator and
   of every gateway process;
5. stops the gateway.

The workloads come from the workload factory (`workload_factory.build_workload`), one request stream per seed,
the same for every N and index. Latencies are in simulated seconds (`bench.to_model_time`); goodput
counts requests within the SLO (`loadtests.slo`). Per cell a `loadtests.results` record plus `gateways`,
`index`, `seed`, `fleet_prefix_queries` / `fleet_prefix_hits` (the replicas' counter increases, in
tokens, whose ratio is `prefix_hit_rate`), `exact_replicas_before` / `_after` (replicas in exact mode
after priming and after the run), the per-group placement (`group_replicas_mean`: distinct
replicas a group's requests were sent to; `group_moves`: times a group's next request went to another
replica than its previous one), and the CPU figures. Records are appended to `--out`/results.jsonl
as each cell ends; `summary.md` is written at the end (`loadtests.gateways_report`), or by
`--summarize DIR`.

    python -m loadtests.gateways_bench --out docs/results/gateways/live
    python -m loadtests.gateways_bench --workloads shared-prefix-pressure --gateways 1 --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from loadtests import bench_fleet
from loadtests.bench import gateway_config, kvgate_commit, to_model_time
from loadtests.bench_processes import (
    GatewayProcess,
    SimFleetProcess,
    choose_layout,
    cpu_seconds,
    pin_self,
    tree_cpu_seconds,
)
from loadtests.gateways_report import group_placement, index_modes, write_summary
from loadtests.measures import fleet_delta
from loadtests.ports import free_port
from loadtests.presets import BenchPreset, FleetPlan
from loadtests.redis_process import RedisServer
from loadtests.results import validate_record
from loadtests.runner import LoadConfig, run_load, scrape_counters
from loadtests.slo import Slo, parse_slo
from loadtests.workload_factory import WorkloadPlan, build_workload
from loadtests.workloads import RandomWorkload
from loadtests.workloads.spec import RequestSpec

INDEXES = ("approximate", "exact")
PROFILE = "default"

# The DES table's shapes (docs/benchmarks.md): 1,024-token prefixes, 64-token questions and turns,
# 64-token answers; 4 groups per replica. `shared-prefix-pressure` is the bench presets' shared-prefix
# (4,096-token system prompts sized to 4x one replica's KV): the exact-vs-approximate pressure case.
PLANS: dict[str, WorkloadPlan] = {
    "shared-prefix": WorkloadPlan(
        "shared-prefix", {"system_prompt_tokens": 1024, "question_tokens": 64, "output_tokens": 64}
    ),
    "multi-turn": WorkloadPlan(
        "multi-turn", {"turns": 4, "system_prompt_tokens": 1024, "user_tokens": 64, "output_tokens": 64}
    ),
    "shared-prefix-pressure": WorkloadPlan(
        "shared-prefix",
        {"system_prompt_tokens": 4096, "question_tokens": 256, "output_tokens": 64, "target_multiple": 4.0},
        label="shared-prefix-pressure",
    ),
}


def plan_for(name: str, replicas: int) -> WorkloadPlan:
    """The named plan; plain shared-prefix gets 4 groups per replica (as the DES table)."""
    plan = PLANS[name]
    if name == "shared-prefix":
        return replace(plan, params={**plan.params, "groups": 4 * replicas})
    return plan


def cell_config(preset: BenchPreset, urls: Sequence[str], events: Sequence[tuple[str, str]] | None,
                redis_url: str, port: int, workload: Any) -> dict[str, Any]:  # fmt: skip
    """`bench.gateway_config` for the default profile, plus the shared Redis store, the replicas' KV
    event endpoints (`events`, None for the approximate index), and event staleness stretched by the
    time scale (10 s of simulated silence, as the default means in wall time)."""
    model = preset.fleet.model_name
    config = gateway_config(PROFILE, urls, model, preset=preset, workload=workload, port=port)
    config["server"]["access_log"] = False
    config["state"] = {"store": redis_url}
    config["scheduling"]["prefix_index"] = {"events_stale_after_s": 10.0 * max(1.0, preset.fleet.time_scale)}
    if events is not None:
        for replica, (pub, replay) in zip(config["replicas"], events, strict=True):
            replica["kv_events"] = pub
            replica["kv_events_replay"] = replay
    return config


async def prime(urls: Sequence[str], model: str, *, seed: int) -> int:
    """One short request straight to each replica (its engine stores a block and publishes); the
    number that failed."""
    failed = 0
    for i, url in enumerate(urls):
        spec = next(iter(RandomWorkload(requests=1, prompt_tokens=64, output_tokens=2, model=model,
                                        seed=10_000 * seed + i).requests()))  # fmt: skip
        result = await run_load(url, [spec], LoadConfig(concurrency=1, max_requests=1, duration_s=60.0))
        failed += sum(1 for t in result.traces if not t.ok) + result.incomplete
    return failed


async def exact_replicas(control: aiohttp.ClientSession, gateway_url: str) -> int:
    """Replicas the gateway routes on the exact index (every worker's picture exact)."""
    async with control.get(gateway_url + "/metrics") as resp:
        return sum(1 for mode in index_modes(await resp.text()).values() if mode == "exact")


async def wait_exact(control: aiohttp.ClientSession, gateway_url: str, want: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        n = await exact_replicas(control, gateway_url)
        if n >= want or time.monotonic() > deadline:
            return n
        await asyncio.sleep(0.2)


class GatewaysBench:
    """One run: the fleet and the Redis server for every cell; `run` goes through the cells."""

    def __init__(self, args: argparse.Namespace, command: str) -> None:
        self.args = args
        self.command = command
        self.out: Path = args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.fleet_plan = FleetPlan(replicas=args.replicas, profile=args.profile, time_scale=args.time_scale,
                                    kv_blocks=args.kv_blocks)  # fmt: skip
        self.slo: Slo = parse_slo(args.slo)
        self.layout = choose_layout(sorted(os.sched_getaffinity(0)), pin=not args.no_pin)
        self.results = self.out / "results.jsonl"

    def preset(self, plan: WorkloadPlan, seed: int) -> BenchPreset:
        a = self.args
        return BenchPreset(
            name="gateways", description="live gateways bench cell", fleet=self.fleet_plan, workloads=(plan,),
            policies=(PROFILE,), concurrency=(a.concurrency,), requests=a.requests,
            warmup_requests=a.warmup_requests, max_duration_s=a.max_duration_s, drain_s=30.0, slo=a.slo,
            seed=seed, gateway_tokenizer="sim",
        )  # fmt: skip

    def meta(self) -> dict[str, Any]:
        a = self.args
        return {
            "command": self.command,
            "kvgate_commit": kvgate_commit(Path(__file__).resolve().parents[1]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "loadavg_at_start": os.getloadavg(),
            "fleet": self.fleet_plan.describe(),
            "process_layout": self.layout.as_meta(),
            "slo": self.slo.as_dict(),
            "concurrency": a.concurrency, "requests": a.requests, "warmup_requests": a.warmup_requests,
            "clock": "simulated: latencies and rates in simulated seconds (wall / time_scale)",
            "profile": PROFILE, "tokenizer": "sim",
        }  # fmt: skip

    async def run(self) -> None:
        a = self.args
        pin_self(self.layout.loadgen_cpus)
        (self.out / "meta.json").write_text(json.dumps(self.meta(), indent=1) + "\n")
        sim_args = [*self.fleet_plan.sim_args(), "--kv-events-port", "0"]
        fleet = SimFleetProcess(sim_args, a.replicas, self.layout.sim_cpus, self.out / "logs" / "sim.log")
        with contextlib.ExitStack() as stack:
            redis_url = a.redis_url or stack.enter_context(RedisServer()).url
            stack.enter_context(fleet)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as control:
                for name in a.workloads:
                    plan = plan_for(name, a.replicas)
                    for seed in a.seeds:
                        preset = self.preset(plan, seed)
                        total = preset.total_requests(plan)
                        workload = build_workload(plan, self.fleet_plan, requests=total, seed=seed)
                        specs = list(workload.requests())[:total]
                        for index in a.indexes:
                            for n in a.gateways:
                                record = await self.cell(control, fleet, redis_url, preset, plan, workload,
                                                         specs, index, n, seed)  # fmt: skip
                                with self.results.open("a") as f:
                                    f.write(json.dumps(record) + "\n")
                                print(_line(record), flush=True)

    async def cell(self, control: aiohttp.ClientSession, fleet: SimFleetProcess, redis_url: str,
                   preset: BenchPreset, plan: WorkloadPlan, workload: Any, specs: list[RequestSpec],
                   index: str, n: int, seed: int) -> dict[str, Any]:  # fmt: skip
        a, scale = self.args, self.fleet_plan.time_scale
        await bench_fleet.reset_prefix_caches(control, fleet.urls)
        events = fleet.kv_events if index == "exact" else None
        config = cell_config(preset, fleet.urls, events, redis_url, free_port(), workload)
        slug = f"{plan.name}-{index}-{n}gw-s{seed}"
        gateway = GatewayProcess(config, self.out / "configs" / f"{slug}.yaml", self.layout.gateway_cpus,
                                 self.out / "logs" / f"gateway-{slug}.log", workers=n)  # fmt: skip
        async with gateway:
            primed_failed = await prime(fleet.urls, self.fleet_plan.model_name, seed=seed)
            want = len(fleet.urls) if index == "exact" else 0
            exact_before = await wait_exact(control, gateway.url, want, timeout_s=30.0)
            warm = preset.plan_warmup(plan)
            load = LoadConfig(
                concurrency=a.concurrency, max_requests=len(specs), duration_s=a.max_duration_s * scale,
                drain_timeout_s=30.0 * scale, request_timeout_s=(a.max_duration_s + 30.0) * scale, seed=seed,
            )  # fmt: skip
            if warm:
                await run_load(gateway.url, specs[:warm], replace(load, max_requests=warm))
            measured = specs[warm:]
            sim_pid, gw_pid = fleet.child.pid if fleet.child else 0, gateway.pid
            counters0 = await scrape_counters(control, fleet.urls)
            health0 = await bench_fleet.scrape_sim_health(control, fleet.urls)
            sim0, gw0, wall0 = cpu_seconds(sim_pid), tree_cpu_seconds(gw_pid), time.perf_counter()
            result = await run_load(gateway.url, measured, replace(load, max_requests=len(measured)))
            wall = time.perf_counter() - wall0
            sim_cpu, gw_cpu = cpu_seconds(sim_pid) - sim0, tree_cpu_seconds(gw_pid) - gw0
            counters1 = await scrape_counters(control, fleet.urls)
            health1 = await bench_fleet.scrape_sim_health(control, fleet.urls)
            exact_after = await exact_replicas(control, gateway.url)
        modelled = to_model_time(result, scale, warmup_s=0.0, duration_s=a.max_duration_s)
        delta = fleet_delta(counters0, counters1)
        record = modelled.to_record(policy=f"{index}/{n}", workload=plan.name, slo=self.slo,
                                    fleet=delta).as_dict()  # fmt: skip
        validate_record(record)
        health = bench_fleet.sim_health_delta(health0, health1)
        placement = group_placement(result.traces)
        record.update(
            gateways=n, index=index, seed=seed, wall_s=wall, primed_failed=primed_failed,
            fleet_prefix_queries=delta.prefix_queries, fleet_prefix_hits=delta.prefix_hits,
            exact_replicas_before=exact_before, exact_replicas_after=exact_after,
            group_replicas_mean=placement.replicas_mean, group_moves=placement.moves,
            groups=placement.groups, sim_step_lag_mean_s=health.lag_mean_s,
            sim_step_lag_p99_s=health.lag_p99_s,
            sim_clock_jump_s=health.clock_jump_s, sim_cpu_frac=sim_cpu / wall if wall else 0.0,
            gateway_cpu_frac=gw_cpu / wall if wall else 0.0, loadavg_end=os.getloadavg()[0],
            workload_params=workload.describe(),
        )  # fmt: skip
        return record


def _line(r: dict[str, Any]) -> str:
    hit = r["prefix_hit_rate"]
    return (
        f"{r['workload']} {r['index']} N={r['gateways']} seed={r['seed']}: hit "
        f"{'-' if hit is None else f'{hit:.1%}'} goodput {r['goodput_rps']:.2f} req/s TTFT p90 "
        f"{r['ttft_p90_s'] or 0:.3f}s errors {r['errors']} exact {r['exact_replicas_before']}/"
        f"{r['exact_replicas_after']} moves {r['group_moves']} gw cpu {r['gateway_cpu_frac']:.2f} "
        f"sim cpu {r['sim_cpu_frac']:.2f} lag p99 {r['sim_step_lag_p99_s']} wall {r['wall_s']:.0f}s"
    )


def _csv(cast: Any) -> Any:
    return lambda s: [cast(x) for x in s.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.gateways_bench", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--out", type=Path, required=False, default=Path("gateways-bench"), help="output directory"
    )
    p.add_argument("--gateways", type=_csv(int), default=[1, 2, 4], help="gateway processes (1,2,4)")
    p.add_argument("--indexes", type=_csv(str), default=list(INDEXES), help="approximate,exact")
    p.add_argument("--workloads", type=_csv(str), default=["shared-prefix", "multi-turn"],
                   help=f"of {', '.join(PLANS)}")  # fmt: skip
    p.add_argument("--seeds", type=_csv(int), default=[0, 1, 2])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--profile", default="llama-3-8b-h100")
    p.add_argument("--kv-blocks", type=int, default=2048, help="per replica, 16 tokens each")
    p.add_argument("--time-scale", type=float, default=4.0, help="wall seconds per simulated second")
    p.add_argument("--concurrency", type=int, default=32, help="closed-loop streams")
    p.add_argument("--requests", type=int, default=240, help="measured requests per cell")
    p.add_argument("--warmup-requests", type=int, default=60, help="unmeasured, before them")
    p.add_argument("--max-duration-s", type=float, default=120.0, help="simulated seconds per cell, at most")
    p.add_argument("--slo", default="ttft=250ms,tpot=50ms")
    p.add_argument("--no-pin", action="store_true", help="do not pin the processes to CPUs")
    p.add_argument("--redis-url", default=None, help="limits shared through this Redis (default: private)")
    p.add_argument(
        "--summarize", type=Path, default=None, help="only write DIR/summary.md from DIR/results.jsonl"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.summarize is not None:
        print(write_summary(args.summarize))
        return 0
    unknown = [w for w in args.workloads if w not in PLANS] + [i for i in args.indexes if i not in INDEXES]
    if unknown:
        print(f"unknown workload or index: {unknown}", file=sys.stderr)
        return 2
    command = "python -m loadtests.gateways_bench " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    bench = GatewaysBench(args, command)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(bench.run())
    print(write_summary(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
