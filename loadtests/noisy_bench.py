"""Noisy neighbour, measured: how much a tenant offering ten times its fair share slows another.

    python -m loadtests.noisy_bench [--repeats 2] [--b-requests 40] [--slots 16] [--replicas 2]
        [--b-prompt-tokens 1024] [--output-jitter J] [--reserve R] [--no-flow-control]
        [--predicted-admission {on,off}] [--knee-factor F] [--light-knee-factor F] [--light-reserve N]
        [--profile P] [--knee-filter {on,off}] [--no-stream] [--seed S] [--traces]
        [--out FILE.json] [--logs DIR]

A simulated fleet (`kvgate sim`, `--replicas` (2) x llama-3-8b-h100 with 2,048 KV blocks, time
scale 5, pinned apart as `kvgate bench` pins it) behind one `kvgate serve` with two tenants, A and B, of equal
weight and band and no rate limits: what protects B is flow control alone (the saturation detector,
the fair queue, deadlines and shedding). Random 1,024-token prompts (nothing cached), 64 output
tokens (`--output-jitter J`: uniform in 64 x [1 - J, 1 + J]). Streamed, or with `--no-stream` one
JSON answer each: then there is no TTFT to report, and B's end-to-end latency stands in for it.

1. Capacity: A alone, closed loop at the fleet's slots (replicas x `--slots`), gives X requests/s.
2. Solo: B alone, open loop at half its fair share (X / 4), `--b-requests` requests.
3. Contended: the same B load, and A open loop at ten times its fair share (5 X): far beyond the
   fleet, so A's requests queue at the gateway and are refused with Retry-After.

`--slots` is the saturation threshold (in-flight requests per replica); `--reserve` the slots per
replica kept for tenants below their fair share (`flow_control.fair_share.reserve_per_replica`;
0 = plain work-conserving fair queuing); `--no-flow-control` turns the gateway's queue off, the
reference for what fair queuing and shedding buy. `--predicted-admission on|off` sets
`flow_control.predicted_admission` (default: kvgate's), `--knee-factor` its `knee_factor`,
`--solo-knee-factor` its `solo_knee_factor`, `--light-knee-factor` its `light_knee_factor`,
`--light-reserve` its `light_reserve`,
`--profile` the scheduling profile (`--knee-filter off`: that profile without its `latency-knee`
filter, overridden under its own name); the pool's latency
prior is the simulator's profile at its time scale either way. `--b-late S` pauses S wall seconds
before the contended phase and starts B S seconds after A in it: past the fair-share window (10 s),
B arrives as a newcomer to a pool A had alone (B's first five contended TTFTs are reported).

Reported per repeat: B's contended TTFT split by whether one of A's requests got its first token
from B's replica while B waited (`--traces`: each of B's requests with its replica and those
counts, in the JSON), B's TTFT p50/p95/p99 solo and contended, the p95 ratio (issue #4 asks for
<= 2x), B's end-to-end p50/p95, B's and A's statuses, and A's goodput. Latencies are simulated seconds
(wall / time scale); the bands' `max_wait_s` is wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway.auth_keys import hash_key
from loadtests.bench_processes import GatewayProcess, SimFleetProcess, choose_layout, pin_self
from loadtests.measures import RequestTrace, percentile
from loadtests.ports import free_port
from loadtests.runner import LoadConfig, RunResult, run_load
from loadtests.workloads import RandomWorkload
from policies.scheduling.builtin_profiles import builtin_profile_spec

TIME_SCALE = 5.0
MODEL = "llama-3-8b"
KEYS = {"A": "noisy-bench-key-a", "B": "noisy-bench-key-b"}


def gateway_config(
    urls: list[str],
    slots: int,
    flow_control: bool = True,
    reserve: int | None = None,
    predicted: bool | None = None,
    knee_factor: float | None = None,
    profile: str | None = None,
    solo_knee_factor: float | None = None,
    light_knee_factor: float | None = None,
    knee_filter: bool = True,
    light_reserve: int | None = None,
) -> dict[str, Any]:
    fair_share = {} if reserve is None else {"fair_share": {"reserve_per_replica": reserve}}
    gate: dict[str, Any] = {} if predicted is None else {"predicted_admission": predicted}
    if knee_factor is not None:
        gate["knee_factor"] = knee_factor
    if solo_knee_factor is not None:
        gate["solo_knee_factor"] = solo_knee_factor
    if light_knee_factor is not None:
        gate["light_knee_factor"] = light_knee_factor
    if light_reserve is not None:
        gate["light_reserve"] = light_reserve
    prior = {"profile": "llama-3-8b-h100", "time_scale": TIME_SCALE}
    sched: dict[str, Any] = {} if profile is None else {"profile": profile}
    if not knee_filter:  # the profile as it was before the filter: overridden by name without it
        name = profile or "default"
        spec = builtin_profile_spec(name)
        spec["filters"] = [f for f in spec["filters"] if f["type"] != "latency-knee"]
        sched["profiles"] = {name: spec}
    routing = {"scheduling": sched} if sched else {}
    return {
        **routing,
        "server": {"host": "127.0.0.1", "port": free_port(), "log_level": "warning"},
        "models": [{"name": MODEL, "latency_prior": prior}],
        "replicas": [{"url": u, "model": MODEL, "name": f"r{i}"} for i, u in enumerate(urls)],
        "tenants": [{"name": n, "api_keys": [hash_key(k)]} for n, k in KEYS.items()],
        "flow_control": {
            "enabled": flow_control,
            "saturation": {"max_in_flight_per_replica": slots, "max_waiting_per_replica": 4},
            "max_queue_per_tenant": 4 * slots,
            "bands": {"standard": {"max_wait_s": 2.0 * TIME_SCALE}},
            **fair_share,
            **gate,
        },
    }


def ttfts(traces: list[RequestTrace]) -> list[float]:
    """Simulated TTFTs of the successful requests."""
    return [(t.first_token - t.start) / TIME_SCALE for t in traces if t.ok and t.first_token is not None]


def b_traces(b: RunResult, a: RunResult) -> list[dict[str, Any]]:
    """Per B request (contended, sent order): when it was sent (simulated seconds from B's first),
    its TTFT, its replica, and the first tokens of A's requests that came from its replica and from
    the other ones while B waited for its own: A's prefills it waited behind or shared steps with
    (from the client's side: A's dispatch time is not known, its first token is)."""
    ok = sorted((t for t in b.traces if t.ok and t.first_token is not None), key=lambda t: t.start)
    if not ok:
        return []
    a_firsts = [(t.replica, t.first_token) for t in a.traces if t.ok and t.first_token is not None]
    t0 = ok[0].start
    rows = []
    for t in ok:
        assert t.first_token is not None
        during = [r for r, f in a_firsts if t.start < f <= t.first_token]
        rows.append({
            "sent_s": (t.start - t0) / TIME_SCALE,
            "ttft_s": (t.first_token - t.start) / TIME_SCALE,
            "replica": t.replica,
            "a_first_tokens_same_replica": sum(r == t.replica for r in during),
            "a_first_tokens_other_replicas": sum(r != t.replica for r in during),
        })  # fmt: skip
    return rows


def trace_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """B's TTFT p50/p95 (ms) split by whether one of A's first tokens came from B's replica while B
    waited (B's prefill waited behind or beside one of A's)."""
    out: dict[str, Any] = {}
    for label, keep in (("a_prefill_same_replica", True), ("no_a_prefill_same_replica", False)):
        xs = sorted(r["ttft_s"] for r in rows if (r["a_first_tokens_same_replica"] > 0) == keep)
        out[label] = {
            "n": len(xs),
            "ttft_p50_ms": percentile(xs, 50) * 1e3 if xs else None,
            "ttft_p95_ms": percentile(xs, 95) * 1e3 if xs else None,
        }
    return out


def first_ttfts(result: RunResult, n: int) -> list[float | None]:
    """Simulated TTFTs of the first `n` requests sent (None: failed or not streamed)."""
    first = sorted(result.traces, key=lambda t: t.start)[:n]
    return [(t.first_token - t.start) / TIME_SCALE if t.ok and t.first_token else None for t in first]


def describe(result: RunResult) -> dict[str, Any]:
    xs = sorted(ttfts(result.traces))
    e2e = sorted(t.e2e / TIME_SCALE for t in result.traces if t.ok)

    def q(p: float, values: list[float] = xs) -> float | None:
        return percentile(values, p) if values else None

    return {
        "requests": len(result.traces),
        "statuses": dict(Counter(t.status for t in result.traces)),
        "ttft_p50_s": q(50),
        "ttft_p95_s": q(95),
        "ttft_p99_s": q(99),
        "e2e_p50_s": q(50, e2e),
        "e2e_p95_s": q(95, e2e),
        "ok_per_s": sum(t.ok for t in result.traces) / result.wall_s * TIME_SCALE,
    }


_ENGINE_SERIES = ("vllm:time_to_first_token_seconds", "vllm:request_queue_time_seconds")


async def engine_sums(replica_urls: list[str]) -> dict[str, float]:
    """Sums and counts of the replicas' engine-side TTFT and queue-time histograms (simulated
    seconds): where a request waited once kvgate had sent it."""
    out = {f"{n}_{k}": 0.0 for n in _ENGINE_SERIES for k in ("sum", "count")}
    async with aiohttp.ClientSession() as session:
        for url in replica_urls:
            async with session.get(url.rstrip("/") + "/metrics") as resp:
                text = await resp.text()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name in out:
                        out[sample.name] += sample.value
    return out


def engine_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """Mean engine TTFT and queue time over the requests finished between two `engine_sums`."""
    means: dict[str, float | None] = {}
    for name in _ENGINE_SERIES:
        n = after[f"{name}_count"] - before[f"{name}_count"]
        total = after[f"{name}_sum"] - before[f"{name}_sum"]
        means[name.removeprefix("vllm:").removesuffix("_seconds") + "_mean_s"] = total / n if n else None
    return means


async def tenant_queue(gateway_url: str, tenant: str) -> dict[str, float]:
    """The gateway's own count of `tenant`'s admissions by path and its queue-wait sum and count
    (wall seconds), to tell B's wait at kvgate from its wait inside the replicas."""
    out = {"direct": 0.0, "queued": 0.0, "wait_sum": 0.0, "wait_count": 0.0}
    async with aiohttp.ClientSession() as session, session.get(gateway_url.rstrip("/") + "/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("tenant") != tenant:
                continue
            if sample.name == "kvgate_admissions_total":
                out[sample.labels["path"]] += sample.value
            elif sample.labels.get("outcome") == "dispatched":
                if sample.name == "kvgate_queue_wait_seconds_sum":
                    out["wait_sum"] += sample.value
                elif sample.name == "kvgate_queue_wait_seconds_count":
                    out["wait_count"] += sample.value
    return out


def queue_share(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """Between two `tenant_queue` reads: the share of admissions that waited in the queue, and their
    mean wait in simulated seconds."""
    d = {k: after[k] - before[k] for k in before}
    admitted = d["direct"] + d["queued"]
    return {
        "queued_share": d["queued"] / admitted if admitted else None,
        "queue_wait_mean_s": d["wait_sum"] / d["wait_count"] / TIME_SCALE if d["wait_count"] else None,
    }


def workload(
    n: int, seed: int, prompt_tokens: int = 1024, output_jitter: float = 0.0, stream: bool = True
) -> list[Any]:
    specs = RandomWorkload(
        requests=n, prompt_tokens=prompt_tokens, output_tokens=64, model=MODEL, seed=seed,
        output_jitter=output_jitter,
    ).requests()  # fmt: skip
    if stream:
        return list(specs)
    return [replace(s, body={**_unstreamed(s.body), "stream": False}) for s in specs]


def _unstreamed(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "stream_options"}


async def one_repeat(
    url: str, replica_urls: list[str], args: argparse.Namespace, seed: int
) -> dict[str, Any]:
    slots, b_requests, b_prompt = args.slots, args.b_requests, args.b_prompt_tokens
    oj, st = args.output_jitter, not args.no_stream
    auth = {name: {"authorization": f"Bearer {key}"} for name, key in KEYS.items()}
    cap_n = 3 * len(replica_urls) * slots
    cap_cfg = LoadConfig(concurrency=len(replica_urls) * slots, max_requests=cap_n, headers=auth["A"])
    capacity = await run_load(url, workload(cap_n, seed, output_jitter=oj, stream=st), cap_cfg)
    x = describe(capacity)["ok_per_s"]  # simulated requests/s
    b_rate, a_rate = x / 4, 5 * x
    b_cfg = LoadConfig(rate=b_rate / TIME_SCALE, max_requests=b_requests, duration_s=1e6, headers=auth["B"])
    solo = await run_load(url, workload(b_requests, seed + 1, b_prompt, oj, st), b_cfg)
    b_window_wall = b_requests / (b_rate / TIME_SCALE)
    late = args.b_late
    a_n = int(a_rate / TIME_SCALE * (b_window_wall + late) * 1.2)
    a_cfg = LoadConfig(
        rate=a_rate / TIME_SCALE, max_requests=a_n, duration_s=b_window_wall * 1.1 + late, headers=auth["A"]
    )
    if late:
        await asyncio.sleep(late)  # B's fair-share window passes: it arrives as a newcomer

    async def b_load() -> RunResult:
        await asyncio.sleep(late)  # A alone first
        return await run_load(url, workload(b_requests, seed + 3, b_prompt, oj, st), b_cfg)

    before, b_before = await engine_sums(replica_urls), await tenant_queue(url, "B")
    noisy, contended = await asyncio.gather(
        run_load(url, workload(a_n, seed + 2, output_jitter=oj, stream=st), a_cfg),
        b_load(),
    )
    engine = engine_means(before, await engine_sums(replica_urls))
    b_queue = queue_share(b_before, await tenant_queue(url, "B"))
    s, c = describe(solo), describe(contended)
    traces = b_traces(contended, noisy)
    ratio = c["ttft_p95_s"] / s["ttft_p95_s"] if s["ttft_p95_s"] and c["ttft_p95_s"] else None
    e2e_ratio = c["e2e_p95_s"] / s["e2e_p95_s"] if s["e2e_p95_s"] and c["e2e_p95_s"] else None
    return {
        "replicas": len(replica_urls),
        "capacity_rps": x,
        "b_rate_rps": b_rate,
        "a_rate_rps": a_rate,
        "b_solo": s,
        "b_contended": c,
        "b_p95_ratio": ratio,
        "b_first5_ttft_s": first_ttfts(contended, 5),
        "b_e2e_p95_ratio": e2e_ratio,
        "a": describe(noisy),
        "engine_contended": engine,
        "b_queue_contended": b_queue,
        "b_trace_summary": trace_summary(traces),
        **({"b_traces": traces} if args.traces else {}),
    }


def fmt(v: float | None, unit: float = 1.0) -> str:
    return "-" if v is None else f"{v * unit:.3g}"


def report(k: int, r: dict[str, Any]) -> str:
    s, c, a, e, bq = r["b_solo"], r["b_contended"], r["a"], r["engine_contended"], r["b_queue_contended"]

    def ms(d: dict[str, Any]) -> str:
        return "/".join(fmt(d[f"ttft_{q}_s"], 1e3) for q in ("p50", "p95", "p99"))

    return (
        f"repeat {k}: capacity {r['capacity_rps']:.1f} req/s; B at {r['b_rate_rps']:.1f}/s, "
        f"A at {r['a_rate_rps']:.1f}/s\n"
        f"  B TTFT p50/p95/p99 solo {ms(s)} ms, contended {ms(c)} ms: p95 ratio "
        f"{fmt(r['b_p95_ratio'])}; B statuses {c['statuses']}\n"
        f"  B's first 5 contended TTFTs {', '.join(fmt(v, 1e3) for v in r['b_first5_ttft_s'])} ms\n"
        f"  B end-to-end p50/p95 solo {fmt(s['e2e_p50_s'], 1e3)}/{fmt(s['e2e_p95_s'], 1e3)} ms, contended "
        f"{fmt(c['e2e_p50_s'], 1e3)}/{fmt(c['e2e_p95_s'], 1e3)} ms: p95 ratio {fmt(r['b_e2e_p95_ratio'])}\n"
        f"  A: {a['requests']} requests, statuses {a['statuses']}, served {a['ok_per_s']:.1f} req/s, "
        f"TTFT p50 {fmt(a['ttft_p50_s'], 1e3)} ms\n"
        f"  engines while contended (A and B): mean TTFT {fmt(e['time_to_first_token_mean_s'], 1e3)} ms, "
        f"mean queue time {fmt(e['request_queue_time_mean_s'], 1e3)} ms\n"
        f"  B at kvgate while contended: {fmt(bq['queued_share'], 100)}% of its requests queued, "
        f"mean wait {fmt(bq['queue_wait_mean_s'], 1e3)} ms\n"
        f"  B's contended TTFT by A's prefills on its replica while it waited: "
        + "; ".join(
            f"{k.replace('_', ' ')}: n {v['n']}, p50/p95 {fmt(v['ttft_p50_ms'])}/{fmt(v['ttft_p95_ms'])} ms"
            for k, v in r["b_trace_summary"].items()
        )
    )


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    layout = choose_layout(sorted(os.sched_getaffinity(0)), pin=not args.no_pin)
    pin_self(layout.loadgen_cpus)
    sim_args = [
        "sim", "--replicas", str(args.replicas), "--port", "0", "--profile", "llama-3-8b-h100",
        "--time-scale", str(TIME_SCALE), "--kv-blocks", "2048",
    ]  # fmt: skip
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kvgate-noisy-") as tmp:
        logs = Path(args.logs or tmp)
        with SimFleetProcess(sim_args, args.replicas, layout.sim_cpus, logs / "sim.log") as sim:
            predicted = None if args.predicted_admission is None else args.predicted_admission == "on"
            cfg = gateway_config(
                sim.urls, args.slots, not args.no_flow_control, args.reserve, predicted, args.knee_factor,
                args.profile, args.solo_knee_factor, args.light_knee_factor, args.knee_filter == "on",
                args.light_reserve,
            )  # fmt: skip
            access = logs / "access.log" if args.logs else None
            gw_proc = GatewayProcess(
                cfg, logs / "gateway.yaml", layout.gateway_cpus, logs / "gw.log", access_log=access
            )
            async with gw_proc as gw:
                for k in range(args.repeats):
                    r = await one_repeat(gw.url, sim.urls, args, args.seed + 100 * k)
                    out.append(r)
                    print(report(k, out[-1]), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.noisy_bench", description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--b-requests", type=int, default=40, help="B's requests per phase")
    p.add_argument("--slots", type=int, default=16, help="in-flight requests per replica before saturation")
    p.add_argument(
        "--replicas",
        type=int,
        default=2,
        choices=range(1, 17),
        metavar="N",
        help="simulated replicas in the pool (1-16)",
    )
    p.add_argument("--b-prompt-tokens", type=int, default=1024, help="B's prompt length (A's: 1,024)")
    p.add_argument(
        "--no-flow-control",
        action="store_true",
        help="flow control off: the reference of what the fair queue and shedding buy",
    )
    p.add_argument(
        "--output-jitter", type=float, default=0.0,
        help="output lengths uniform in 64 x [1 - J, 1 + J] (default 0: all 64, finishing in lockstep)",
    )  # fmt: skip
    p.add_argument(
        "--reserve", type=int, help="flow_control.fair_share.reserve_per_replica (default: kvgate's)"
    )
    p.add_argument(
        "--predicted-admission", choices=("on", "off"), help="the latency gate (default: kvgate's)"
    )
    p.add_argument("--knee-factor", type=float, help="flow_control.knee_factor (default: kvgate's)")
    p.add_argument("--solo-knee-factor", type=float, help="flow_control.solo_knee_factor (default: kvgate's)")
    p.add_argument(
        "--light-knee-factor", type=float, help="flow_control.light_knee_factor (default: kvgate's)"
    )
    p.add_argument("--light-reserve", type=int, help="flow_control.light_reserve (default: kvgate's)")
    p.add_argument("--profile", help="scheduling.profile (default: kvgate's)")
    p.add_argument(
        "--knee-filter", choices=("on", "off"), default="on",
        help="off: the profile without its latency-knee filter (the routing before it)",
    )  # fmt: skip
    p.add_argument("--no-stream", action="store_true", help="non-streaming requests (one JSON answer each)")
    p.add_argument(
        "--b-late", type=float, default=0.0,
        help="wall seconds of pause before the contended phase and of A alone before B starts in it "
        "(more than the fair-share window, 10 s: B arrives as a newcomer to a pool A had alone)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="the first repeat's seed (then +100 per repeat)")
    p.add_argument(
        "--traces", action="store_true",
        help="also write B's contended requests one by one into --out (TTFT, replica, A's first tokens "
        "while it waited)",
    )  # fmt: skip
    p.add_argument("--out", help="write the figures as JSON")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--logs", help="keep the gateway's and the simulator's logs (access log included) here")
    args = p.parse_args(argv)
    if args.logs:
        Path(args.logs).mkdir(parents=True, exist_ok=True)
    results = asyncio.run(run(args))
    if args.out:
        Path(args.out).write_text(json.dumps({"time_scale": TIME_SCALE, "repeats": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
