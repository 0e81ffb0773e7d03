"""Chaos and soak: kvgate under steady streaming load while replicas, Redis and clients misbehave.

    python -m loadtests.chaos_soak [--duration 600] [--concurrency 500] [--replicas 3]
        [--store-modes open,closed] [--phase 40] [--no-faults] [--out FILE.json]

Processes, all on loopback: one `kvgate sim --replicas 1` per replica (so one can be killed and
restarted on its port), a private `redis-server` holding the tenants' limits, and one `kvgate serve`
per `on_store_error` mode in `--store-modes` (both share the Redis and the fleet; the clients are
split evenly between them). The load: `--concurrency` closed-loop clients of four tenants, mostly
streams, some unary, some hanging up early, each waiting a refusal's Retry-After (at most 2 s) before
its next request (`loadtests.chaos_client`). The faults:
`loadtests.chaos_schedule` (errors, crashes and hangs mid-stream, hangs before the first byte,
slowdown, failing health, a replica process killed and restarted, Redis killed and restarted).

Reported: requests sent and how each ended; the failures that must be 0 (hung, broken, incomplete,
kvgate's own 500s); the longest wait inside a started stream against kvgate's chunk timeout + 1 s;
each gateway's in-flight requests, tenant in-flight counts, queue depth and fair-share counts after
the load stopped (every reservation settled: all 0); its RSS and CPU sampled every 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway.auth_keys import hash_key
from loadtests.bench_processes import GatewayProcess, SimFleetProcess, cpu_seconds, rss_bytes
from loadtests.chaos_client import FAILURE_KINDS, Bounds, Outcome, plan_request, send
from loadtests.chaos_schedule import SIM_FAULTS, FaultWindow, build_schedule
from loadtests.ports import free_port
from loadtests.redis_process import RedisServer
from loadtests.workloads.text import WordText

MODEL = "llama-3-8b"
ADMIN_KEY = "chaos-admin-key"
TENANTS = ("t0", "t1", "t2", "t3")
UPSTREAM = {
    "connect_timeout_s": 1.0,
    "first_byte_timeout_s": 5.0,
    "chunk_timeout_s": 3.0,
    "response_timeout_s": 60.0,
    "max_retries": 2,
}
STANDARD_MAX_WAIT_S = 10.0
RETRY_AFTER_CAP_S = 2.0  # a refused client waits its Retry-After, at most this (the run is short)
_SUMMED = frozenset(
    {
        "kvgate_requests_in_flight",
        "kvgate_tenant_in_flight",
        "kvgate_queue_depth",
        "kvgate_state_settles_dropped_total",
        "kvgate_client_disconnects_total",
    }
)


def tenant_key(name: str) -> str:
    return f"chaos-key-{name}"


def gateway_config(urls: list[str], redis_url: str, mode: str, gateways: int) -> dict[str, Any]:
    tenants = [
        {
            "name": name,
            "api_keys": [hash_key(tenant_key(name))],
            # t3 is tight on tokens: it meets 429s all along; the others rarely.
            "limits": {
                "rpm": 60_000,
                "tpm": 300_000 if name == "t3" else 20_000_000,
                "max_output_tokens": 256,
            },
        }
        for name in TENANTS
    ]
    return {
        "server": {"host": "127.0.0.1", "port": free_port(), "log_level": "warning"},
        "replicas": [{"url": u, "model": MODEL, "name": f"r{i}"} for i, u in enumerate(urls)],
        "upstream": UPSTREAM,
        "tenants": tenants,
        "auth": {"admin_keys": [hash_key(ADMIN_KEY)]},
        "state": {"store": redis_url, "on_store_error": mode, "gateways": gateways},
        "flow_control": {"bands": {"standard": {"max_wait_s": STANDARD_MAX_WAIT_S}}},
    }


def bounds() -> Bounds:
    attempts = 1 + UPSTREAM["max_retries"]
    per_attempt = UPSTREAM["connect_timeout_s"] + UPSTREAM["first_byte_timeout_s"]
    return Bounds(
        first_byte_bound_s=STANDARD_MAX_WAIT_S + attempts * per_attempt + 5.0,
        chunk_bound_s=UPSTREAM["chunk_timeout_s"] + 1.0,
        unary_bound_s=STANDARD_MAX_WAIT_S + attempts * UPSTREAM["response_timeout_s"] + 5.0,
    )


class Fleet:
    """One `kvgate sim` process per replica on fixed ports, so a killed one comes back on its URL."""

    def __init__(self, replicas: int, sim_args: list[str], logs: Path) -> None:
        self.ports = [free_port() for _ in range(replicas)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self._args = sim_args
        self._logs = logs
        self.procs: list[SimFleetProcess | None] = [None] * replicas

    def start(self, i: int) -> None:
        args = ["sim", "--replicas", "1", "--port", str(self.ports[i]), *self._args]
        p = SimFleetProcess(args, 1, None, self._logs / f"sim{i}.log")
        p.start()
        self.procs[i] = p

    def kill(self, i: int) -> None:
        p = self.procs[i]
        if p is not None and p.child is not None:
            p.child.proc.kill()
            p.stop()
        self.procs[i] = None

    def __enter__(self) -> Fleet:
        for i in range(len(self.ports)):
            self.start(i)
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p is not None:
                p.stop()


async def run_faults(
    schedule: list[FaultWindow], fleet: Fleet, redis: RedisServer, t0: float, log: list[dict[str, Any]]
) -> None:
    """Switch each window's fault on at its start and off at its end (times from `t0`)."""
    events: list[tuple[float, bool, FaultWindow]] = sorted(
        [(w.start_s, True, w) for w in schedule] + [(w.end_s, False, w) for w in schedule],
        key=lambda e: (e[0], e[1]),
    )
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        for at, on, w in events:
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            try:
                await _switch(session, w, on, fleet, redis)
                log.append(
                    {"t": round(time.monotonic() - t0, 1), "kind": w.kind, "replica": w.replica, "on": on}
                )
            except Exception as err:  # a fault that could not be switched is reported, not fatal
                log.append({"t": round(time.monotonic() - t0, 1), "kind": w.kind, "error": repr(err)})


async def _switch(
    session: aiohttp.ClientSession, w: FaultWindow, on: bool, fleet: Fleet, redis: RedisServer
) -> None:
    if w.kind == "calm":
        return
    if w.kind == "kill_redis":
        await asyncio.to_thread(redis.stop if on else redis.start)
        return
    assert w.replica is not None
    if w.kind == "kill_replica":
        await asyncio.to_thread(fleet.kill if on else fleet.start, w.replica)
        return
    url = fleet.urls[w.replica] + "/sim/faults"
    if on:
        async with session.post(url, json=SIM_FAULTS[w.kind]) as resp:
            resp.raise_for_status()
    else:
        async with session.delete(url) as resp:
            resp.raise_for_status()


def prompts(rng: random.Random, n: int = 64) -> list[str]:
    """Prompts of 100-700 tokens, in 8 groups sharing a 300-token prefix (the routing's business)."""
    text = WordText()
    prefixes = [text.text(rng, 300) for _ in range(8)]
    return [rng.choice(prefixes) + " " + text.text(rng, rng.randint(0, 400)) for _ in range(n)]


async def clients(
    url: str, n: int, until: float, rng: random.Random, texts: list[str], tally: list[Outcome]
) -> None:
    b = bounds()
    keys = [tenant_key(t) for t in TENANTS]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None)
    ) as session:

        async def worker(seed: int) -> None:
            r = random.Random(seed)
            while time.monotonic() < until:
                plan = plan_request(r, keys, MODEL, texts)
                out = await send(session, url + "/v1/chat/completions", plan, b)
                tally.append(out)
                if out.retry_after_s is not None:  # as OpenAI's SDKs do, within reason
                    await asyncio.sleep(min(out.retry_after_s, RETRY_AFTER_CAP_S))

        await asyncio.gather(*(worker(rng.randrange(1 << 30)) for _ in range(n)))


async def sample_processes(pids: dict[str, int], t0: float, until: float, out: list[dict[str, Any]]) -> None:
    while time.monotonic() < until:
        row: dict[str, Any] = {"t": round(time.monotonic() - t0, 1)}
        for name, pid in pids.items():
            row[name] = {"rss_mb": round(rss_bytes(pid) / 1e6, 1), "cpu_s": round(cpu_seconds(pid), 1)}
        out.append(row)
        await asyncio.sleep(10.0)


async def settled(url: str) -> dict[str, Any]:
    """What a gateway still holds once the load stopped: every figure should be 0."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async with session.get(url + "/metrics") as resp:
            text = await resp.text()
        async with session.get(
            url + "/admin/tenants", headers={"authorization": f"Bearer {ADMIN_KEY}"}
        ) as resp:
            tenants = (await resp.json())["data"]
    found: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = None
            if s.name in _SUMMED:
                key = s.name
            elif s.name == "kvgate_upstream_errors_total":
                key = "upstream_errors." + s.labels["kind"]
            elif s.name == "kvgate_requests_total":
                key = "status." + s.labels["status"]
            if key is not None:
                found[key] = found.get(key, 0.0) + s.value
    return {
        "metrics": found,
        "tenants": {t["name"]: {"in_flight": t["in_flight"], "queued": t["queued"]} for t in tenants},
    }


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    kinds = Counter(o.kind for o in outcomes)
    statuses = Counter(o.status for o in outcomes if o.kind == "http_error")
    streams = [o.max_gap_s for o in outcomes if o.max_gap_s > 0]
    failures = [asdict(o) for o in outcomes if o.kind in FAILURE_KINDS][:20]
    return {
        "requests": len(outcomes),
        "kinds": dict(kinds),
        "http_error_statuses": {str(k): v for k, v in sorted(statuses.items())},
        "failures": sum(kinds[k] for k in FAILURE_KINDS),
        "failure_examples": failures,
        "max_stream_gap_s": round(max(streams, default=0.0), 3),
    }


@contextlib.contextmanager
def workdir(keep: str | None) -> Iterator[Path]:
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        yield Path(keep)
        return
    with tempfile.TemporaryDirectory(prefix="kvgate-chaos-") as tmp:
        yield Path(tmp)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    modes = [m for m in args.store_modes.split(",") if m]
    sim_args = ["--profile", args.profile, "--time-scale", str(args.time_scale)]
    rng = random.Random(args.seed)
    texts = prompts(rng)
    schedule = [] if args.no_faults else build_schedule(args.duration, args.replicas, args.phase)
    with workdir(args.logs) as logs, RedisServer() as redis, Fleet(args.replicas, sim_args, logs) as fleet:
        gws = [
            GatewayProcess(
                gateway_config(fleet.urls, redis.url, m, len(modes)),
                logs / f"gw-{m}.yaml",
                None,
                logs / f"gw-{m}.log",
            )
            for m in modes
        ]
        async with contextlib.AsyncExitStack() as stack:
            for gw in gws:
                await stack.enter_async_context(gw)
            t0 = time.monotonic()
            until = t0 + args.duration
            fault_log: list[dict[str, Any]] = []
            samples: list[dict[str, Any]] = []
            tallies: list[list[Outcome]] = [[] for _ in gws]
            per_gw = max(1, args.concurrency // len(gws))
            tasks = [asyncio.create_task(run_faults(schedule, fleet, redis, t0, fault_log))]
            tasks.append(
                asyncio.create_task(
                    sample_processes(
                        {m: gw.pid for m, gw in zip(modes, gws, strict=False)}, t0, until + 30, samples
                    )
                )
            )
            await asyncio.gather(
                *(
                    clients(gw.url, per_gw, until, random.Random(rng.random()), texts, t)
                    for gw, t in zip(gws, tallies, strict=False)
                )
            )
            ended = time.monotonic() - t0
            await asyncio.sleep(3.0)  # settles and refunds in flight finish
            after = {m: await settled(gw.url) for m, gw in zip(modes, gws, strict=False)}
            for t in tasks:
                t.cancel()
            logs_text = {m: (logs / f"gw-{m}.log").read_text(errors="replace") for m in modes}
    return {
        "args": vars(args),
        "load_ended_s": round(ended, 1),
        "gateways": {
            m: {
                "clients": per_gw,
                "outcomes": summarize(t),
                "after_load": after[m],
                "log_tracebacks": logs_text[m].count("Traceback"),
            }
            for m, t in zip(modes, tallies, strict=False)
        },
        "process_samples": samples,
        "faults": fault_log,
    }


def report(result: dict[str, Any]) -> str:
    lines = [f"chaos/soak: {result['args']['duration']:g}s, {result['args']['concurrency']} clients"]
    for mode, g in result["gateways"].items():
        o = g["outcomes"]
        lines.append(
            f"[{mode}] requests {o['requests']}  kinds {o['kinds']}  errors {o['http_error_statuses']}  "
            f"failures {o['failures']}  max stream gap {o['max_stream_gap_s']}s  "
            f"tracebacks {g['log_tracebacks']}"
        )
        lines.append(f"[{mode}] after load: {g['after_load']}")
    samples = result["process_samples"]
    if samples:
        lines.append(f"first sample {samples[0]}")
        lines.append(f"last sample  {samples[-1]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.chaos_soak", description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    p.add_argument("--concurrency", type=int, default=500, help="clients, split over the gateways")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--profile", default="llama-3-8b-h100")
    p.add_argument("--time-scale", type=float, default=10.0)
    p.add_argument("--store-modes", default="open,closed", help="one gateway per on_store_error mode")
    p.add_argument("--phase", type=float, default=40.0, help="seconds per fault phase (half on, half off)")
    p.add_argument("--no-faults", action="store_true", help="a plain soak")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--logs", help="keep the processes' logs and configs in this directory")
    p.add_argument("--out", help="write the result as JSON")
    args = p.parse_args(argv)
    result = asyncio.run(run(args))
    print(report(result), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 1 if any(g["outcomes"]["failures"] for g in result["gateways"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
