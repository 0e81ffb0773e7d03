"""A/B routing, measured: sticky versus per-request random assignment on conversations, and what a
10% mirror costs the primary.

    python -m loadtests.ab_bench [--seeds 3] [--conversations 32] [--active 16] [--turns 5]
        [--time-scale 5] [--out FILE.json]

A simulated fleet (`kvgate sim`: 2 x llama-3-8b-h100 with 2,048 KV blocks of 16 tokens each, LoRA
with 3 slots and the adapters chat-a, chat-b and chat-c loaded at start, pinned apart as `kvgate
bench` pins it) behind one `kvgate serve` with three routes over the same two arms, 50/50
llama-3-8b:chat-a / llama-3-8b:chat-b:

- `sticky`: `sticky_by: [header:x-session-id]`, a conversation keeps its arm;
- `random`: no sticky key, every request draws its arm;
- `mirrored`: as `sticky`, plus a shadow copy of 10% of the requests to llama-3-8b:chat-c.

`--priority` runs the replicas with `--scheduling-policy priority` and kvgate with
`flow_control.pass_priority`: real requests carry their band, shadow copies a lower priority.

The workload is `multi-turn` (a system prompt of `--system-tokens` tokens, 128 per user turn, 64
output tokens per answer; `--active` conversations at once, closed loop), each request sent with its
conversation's `x-session-id`, so session affinity keeps a conversation on its replica in every
phase: what differs is only the arm. vLLM keys its prefix cache by adapter, so a conversation that
changes arm finds nothing of its history cached under the new one. Per seed the three phases run in
a rotated order, each on fresh conversations, with the replicas' prefix caches emptied before each.

The first `--warmup-s` seconds (wall) of each phase are not measured: all `--active` conversations
open at once there, a burst of uncached system prompts that is the same in every mode and would
otherwise decide the high percentiles. Reported per phase: the prefix hit rate (cached / prompt
tokens, from the replicas' usage in each answer) and TTFT p50 / p90 / p99 in simulated seconds
(wall / time scale); for `mirrored`, the copies sent and dropped. Then over the seeds, the median
and the worst of: each mode's hit rate and TTFT p90, and the change of the primary's TTFT p99 with
the mirror on (mirrored versus sticky).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from loadtests.bench_fleet import reset_prefix_caches
from loadtests.bench_processes import GatewayProcess, SimFleetProcess, choose_layout, pin_self
from loadtests.ports import free_port
from loadtests.runner import LoadConfig, RunResult, run_load
from loadtests.workloads import MultiTurnWorkload
from loadtests.workloads.spec import RequestSpec, chat_body_from_messages

BASE = "llama-3-8b"
ARMS = [f"{BASE}:chat-a", f"{BASE}:chat-b"]
MIRROR = f"{BASE}:chat-c"
PHASES = ("sticky", "random", "mirrored")


def gateway_config(urls: list[str], priority: bool = False) -> dict[str, Any]:
    split = [{"model": a, "weight": 50} for a in ARMS]
    sticky = ["header:x-session-id"]
    return {
        "flow_control": {"pass_priority": priority},
        "server": {"host": "127.0.0.1", "port": free_port(), "log_level": "warning"},
        "replicas": [{"url": u, "model": BASE, "name": f"r{i}"} for i, u in enumerate(urls)],
        "models": [{"name": BASE}],
        "routes": [
            {"name": "sticky", "targets": split, "sticky_by": sticky},
            {"name": "random", "targets": split},
            {
                "name": "mirrored",
                "targets": split,
                "sticky_by": sticky,
                "mirror": {"model": MIRROR, "percent": 10, "max_in_flight": 8},
            },
        ],
    }


def workload(phase: str, args: argparse.Namespace, seed: int) -> list[RequestSpec]:
    wl = MultiTurnWorkload(
        conversations=args.conversations, turns=args.turns, system_prompt_tokens=args.system_tokens,
        user_tokens=128, output_tokens=64, model=phase, seed=seed * 10 + PHASES.index(phase),
        active_conversations=args.active,
    )  # fmt: skip
    return [replace(s, headers={"x-session-id": f"{phase}-{seed}-{s.session_id}"}) for s in wl.requests()]


async def shadow_counts(gateway_url: str) -> dict[str, float]:
    """Shadow copies answered and dropped so far (this gateway's counters)."""
    out = {"sent": 0.0, "dropped": 0.0}
    async with aiohttp.ClientSession() as session, session.get(gateway_url + "/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "kvgate_route_requests_total" and s.labels.get("shadow") == "true":
                out["sent"] += s.value
            elif s.name == "kvgate_route_mirror_dropped_total":
                out["dropped"] += s.value
    return out


def describe(result: RunResult, time_scale: float) -> dict[str, Any]:
    m = result.summarize()

    def sim(v: float | None) -> float | None:
        return None if v is None else v / time_scale

    return {
        "requests": m.requests,  # measured: started after the warm-up
        "errors": m.errors,
        "error_kinds": dict(m.error_kinds),
        "hit_rate": m.cached_token_fraction,
        "ttft_p50_s": sim(m.ttft.p50),
        "ttft_p90_s": sim(m.ttft.p90),
        "ttft_p99_s": sim(m.ttft.p99),
        "loadgen_cpu_frac": result.loadgen.cpu_s / result.wall_s if result.wall_s else None,
    }


async def warm_up(gw_url: str) -> None:
    """A few requests to each adapter, so that the first phase does not pay the adapters' first load
    into the engines' LoRA slots."""
    specs = [
        RequestSpec(
            request_id=f"warm-{m}-{i}",
            endpoint="chat",
            body=chat_body_from_messages(m, [{"role": "user", "content": f"warm up {i}"}], 4),
        )
        for m in (*ARMS, MIRROR)
        for i in range(4)
    ]
    result = await run_load(gw_url, specs, LoadConfig(concurrency=4, max_requests=len(specs), duration_s=1e6))
    if any(not t.ok for t in result.traces):
        raise RuntimeError("the warm-up failed: " + next(str(t.error) for t in result.traces if not t.ok))


async def one_seed(
    gw_url: str, replica_urls: list[str], args: argparse.Namespace, seed: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    order = PHASES[seed % 3 :] + PHASES[: seed % 3]
    for phase in order:
        async with aiohttp.ClientSession() as control:
            await reset_prefix_caches(control, replica_urls)
        specs = workload(phase, args, seed)
        load = LoadConfig(
            concurrency=args.active, max_requests=len(specs), duration_s=1e6, warmup_s=args.warmup_s
        )
        before = await shadow_counts(gw_url)
        result = await run_load(gw_url, specs, load)
        out[phase] = describe(result, args.time_scale)
        out[phase]["wall_s"] = result.wall_s
        if phase == "mirrored":
            await asyncio.sleep(2.0 * args.time_scale)  # let the last copies end before counting them
            after = await shadow_counts(gw_url)
            out[phase]["copies_sent"] = after["sent"] - before["sent"]
            out[phase]["copies_dropped"] = after["dropped"] - before["dropped"]
        print(f"seed {seed} {phase:8s} {fmt_phase(out[phase])}", flush=True)
    s, m = out["sticky"]["ttft_p99_s"], out["mirrored"]["ttft_p99_s"]
    out["mirror_p99_change"] = (m / s - 1.0) if s and m else None
    return out


def fmt(v: float | None, unit: float = 1.0, spec: str = ".3g") -> str:
    return "-" if v is None else format(v * unit, spec)


def fmt_phase(p: dict[str, Any]) -> str:
    extra = ""
    if "copies_sent" in p:
        extra = f", copies {p['copies_sent']:.0f} sent / {p['copies_dropped']:.0f} dropped"
    return (
        f"hit rate {fmt(p['hit_rate'], 100, '.1f')}%, TTFT p50/p90/p99 "
        f"{fmt(p['ttft_p50_s'], 1e3)}/{fmt(p['ttft_p90_s'], 1e3)}/{fmt(p['ttft_p99_s'], 1e3)} ms, "
        f"{p['requests']} requests, {p['errors']} errors{' ' + str(p['error_kinds']) if p['errors'] else ''}"
        ", "
        f"{p['wall_s']:.0f} s wall{extra}"
    )


def summarize(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst over the seeds (worst: the lowest hit rate, the highest latency or change)."""

    def both(values: list[float | None], worst: Any) -> dict[str, float | None]:
        v = [x for x in values if x is not None]
        return {"median": statistics.median(v) if v else None, "worst": worst(v) if v else None}

    out: dict[str, Any] = {}
    for phase in PHASES:
        out[phase] = {
            "hit_rate": both([s[phase]["hit_rate"] for s in seeds], min),
            "ttft_p90_s": both([s[phase]["ttft_p90_s"] for s in seeds], max),
            "ttft_p99_s": both([s[phase]["ttft_p99_s"] for s in seeds], max),
        }
    out["mirror_p99_change"] = both([s["mirror_p99_change"] for s in seeds], max)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    layout = choose_layout(sorted(os.sched_getaffinity(0)), pin=not args.no_pin)
    pin_self(layout.loadgen_cpus)
    sim_args = [
        "sim", "--replicas", str(args.replicas), "--port", "0", "--profile", "llama-3-8b-h100",
        "--time-scale", str(args.time_scale), "--kv-blocks", str(args.kv_blocks), "--max-loras", "3",
        "--adapters", "chat-a,chat-b,chat-c",
    ]  # fmt: skip
    if args.priority:
        sim_args += ["--scheduling-policy", "priority"]
    seeds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kvgate-ab-") as tmp:
        logs = Path(tmp)
        with SimFleetProcess(sim_args, args.replicas, layout.sim_cpus, logs / "sim.log") as sim:
            cfg = gateway_config(sim.urls, args.priority)
            async with GatewayProcess(cfg, logs / "gateway.yaml", layout.gateway_cpus, logs / "gw.log") as gw:
                await warm_up(gw.url)
                for seed in range(args.seeds):
                    seeds.append(await one_seed(gw.url, sim.urls, args, seed))
    summary = summarize(seeds)
    print(report(summary), flush=True)
    return {"args": vars(args), "layout": layout.as_meta(), "seeds": seeds, "summary": summary}


def report(s: dict[str, Any]) -> str:
    lines = [
        "| phase | hit rate median (worst) | TTFT p90 median (worst), ms | TTFT p99 median (worst), ms |",
        "|---|---|---|---|",
    ]
    for phase in PHASES:
        p = s[phase]
        hit = p["hit_rate"]
        lines.append(
            f"| {phase} | {fmt(hit['median'], 100, '.1f')}% ({fmt(hit['worst'], 100, '.1f')}%) "
            f"| {fmt(p['ttft_p90_s']['median'], 1e3)} ({fmt(p['ttft_p90_s']['worst'], 1e3)}) "
            f"| {fmt(p['ttft_p99_s']['median'], 1e3)} ({fmt(p['ttft_p99_s']['worst'], 1e3)}) |"
        )
    c = s["mirror_p99_change"]
    lines.append(
        f"primary TTFT p99 with the 10% mirror vs without: median {fmt(c['median'], 100, '+.1f')}%, "
        f"worst {fmt(c['worst'], 100, '+.1f')}%"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.ab_bench", description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--conversations", type=int, default=32, help="conversations per phase")
    p.add_argument("--active", type=int, default=16, help="conversations at once (closed-loop streams)")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--system-tokens", type=int, default=1024, help="each conversation's system prompt")
    p.add_argument("--kv-blocks", type=int, default=2048, help="KV blocks of 16 tokens per replica")
    p.add_argument("--time-scale", type=float, default=5.0, help="wall seconds per simulated second")
    p.add_argument(
        "--warmup-s", type=float, default=5.0,
        help="wall seconds at the start of each phase not measured: every conversation's first turn "
        "arrives at once there, the same burst of uncached prefills in every mode",
    )  # fmt: skip
    p.add_argument(
        "--priority", action="store_true",
        help="replicas schedule by priority and kvgate passes it (flow_control.pass_priority): shadow "
        "copies then run after real requests",
    )  # fmt: skip
    p.add_argument("--out", help="write every figure as JSON")
    p.add_argument("--no-pin", action="store_true")
    args = p.parse_args(argv)
    results = asyncio.run(run(args))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
