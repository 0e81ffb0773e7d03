"""What kvgate adds to a request: latency through the gateway versus straight to a replica, and CPU.

    python -m loadtests.overhead_bench [--concurrency 1,50,200] [--requests 2000] [--chunks 32] [--route]

Three processes on this 2-core machine: kvgate pinned alone to core 0 (flow control off, see
`run`), the simulated replica and this load generator sharing core 1 (`taskset` and
`sched_setaffinity` when available). The replica runs the `tiny` profile with its model time scaled
near zero, so what is measured is HTTP, routing and relay work. Each concurrency runs the same
closed-loop load straight to the replica and through kvgate, interleaved (direct, gateway, direct,
gateway with --repeats 2) so slow drift of the shared machine hits both.

Reported per concurrency: TTFT p50/p99 direct and through kvgate and their difference (the added
latency), end-to-end p50, requests/s, and kvgate's CPU per request and per relayed chunk (from
/proc/<pid>/stat); "chunks relayed per core-second" is chunks relayed / kvgate CPU seconds.

`--pace-ms MS`: the upstream is `loadtests.paced_replica` instead of the simulator: every stream's
chunks come MS apart (its first at once), as a decoding engine delivers them, so kvgate's cost per
relayed chunk is measured at the rate real streams arrive (a burst of 32 chunks costs much less per
chunk than 32 wake-ups). The paced replica and the load generator share core 1.

`--workers N`: kvgate runs as `kvgate serve --workers N` (gateway/supervisor.py), the supervisor
and every worker pinned to core 0 with the other processes on core 1 (`--gateway-cpus 0,1`: kvgate's
processes may run on both cores, beside the others); kvgate's CPU is the sum over the supervisor
and its workers. With `--workers` (1 included, so that 1 and 2 compare alike) the
limits are shared through a private `redis-server` (on core 1), as several workers require.

`--route`: each through-kvgate run is followed by the same load sent to the route `tiny-route` (one
target, the same model), so every request is resolved through a route and every chunk of its answer
has its `model` field rewritten (`"model":"tiny-llama"` -> `"model":"tiny-route"`, gateway/forwarder);
a "route" row follows each concurrency's row. Before the load, the rewrite's own cost per relayed
chunk is timed in this process on a vLLM-shaped chunk (`rewrite_micro`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from loadtests.runner import LoadConfig, RunResult, run_load
from loadtests.workloads.random_prompts import RandomWorkload

MODEL = "tiny-llama"
ROUTE = "tiny-route"


def _taskset(cores: int | str) -> list[str]:
    return ["taskset", "-c", str(cores)] if _has_taskset() else []


def _has_taskset() -> bool:
    return subprocess.run(["which", "taskset"], capture_output=True).returncode == 0


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and of its live children (a supervisor's workers), seconds."""
    total = 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    for p in [pid, *_children(pid)]:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@contextlib.contextmanager
def child(
    cmd: list[str], ready_prefix: str, timeout: float = 30.0
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{cmd[0:6]} exited: {proc.poll()}")
            if line.startswith(ready_prefix):
                break
        yield proc, line.strip()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError(url)


@dataclass
class Point:
    concurrency: int
    direct: list[RunResult]
    gateway: list[RunResult]
    gw_cpu_s: float
    gw_requests: int
    gw_chunks: int
    label: str = ""
    wall_s: float = 0.0  # of the through-kvgate runs
    sim_cpu_s: float = 0.0  # the replica's CPU over them


def rewrite_micro(chunks: int = 200_000) -> tuple[float, float]:
    """ns per relayed chunk of the SSE filter alone and with the model rewrite, on one vLLM-shaped
    chat chunk (best of 5 runs of `chunks` feeds each)."""
    import timeit

    from gateway.forwarder import _rewriting
    from gateway.sse_filter import SseFilter

    chunk = (
        b'data: {"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk","created":1796307374,'
        b'"model":"tiny-llama","choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,'
        b'"finish_reason":null}]}\n\n'
    )
    plain = SseFilter(strip_usage=True).feed
    rewriting = _rewriting(SseFilter(strip_usage=True).feed, b'"model":"tiny-llama"', b'"model":"tiny-route"')
    assert b'"model":"tiny-route"' in rewriting(chunk)
    def per_chunk_ns(feed: Callable[[bytes], bytes]) -> float:
        return min(timeit.repeat(functools.partial(feed, chunk), number=chunks, repeat=5)) / chunks * 1e9

    return per_chunk_ns(plain), per_chunk_ns(rewriting)


def _pct(results: list[RunResult], attr: str, q: str) -> float:
    values: list[float] = []
    for r in results:
        stats = getattr(r.summarize(), attr)
        values.append(float(getattr(stats, q)))
    return sum(values) / len(values)


async def measure(
    args: argparse.Namespace, sim_url: str, gw_url: str, gw_pid: int, sim_pid: int
) -> list[Point]:
    await wait_http(gw_url + "/ready")
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {1})
    points: list[Point] = []
    for c in args.concurrency:
        n = max(args.requests, c * 4)
        wl = RandomWorkload(requests=n, prompt_tokens=args.prompt_tokens, output_tokens=args.chunks,
                            model=MODEL, seed=c)  # fmt: skip
        load = LoadConfig(concurrency=c, max_requests=n, duration_s=args.max_seconds, warmup_s=0.0)
        routed_wl = RandomWorkload(requests=n, prompt_tokens=args.prompt_tokens, output_tokens=args.chunks,
                                   model=ROUTE, seed=c)  # fmt: skip
        direct: list[RunResult] = []
        through: list[RunResult] = []
        routed: list[RunResult] = []
        cpu = cpu_routed = sim_cpu = 0.0
        for _ in range(args.repeats):
            direct.append(await run_load(sim_url, list(wl.requests()), load))
            c0, s0 = cpu_seconds(gw_pid), cpu_seconds(sim_pid)
            through.append(await run_load(gw_url, list(wl.requests()), load))
            cpu += cpu_seconds(gw_pid) - c0
            sim_cpu += cpu_seconds(sim_pid) - s0
            if args.route:
                c0 = cpu_seconds(gw_pid)
                routed.append(await run_load(gw_url, list(routed_wl.requests()), load))
                cpu_routed += cpu_seconds(gw_pid) - c0
        reqs = sum(len(r.traces) for r in through)
        chunks = sum(t.output_tokens for r in through for t in r.traces)
        wall = sum(r.wall_s for r in through)
        points.append(Point(c, direct, through, cpu, reqs, chunks, wall_s=wall, sim_cpu_s=sim_cpu))
        print_point(points[-1])
        if args.route:
            reqs = sum(len(r.traces) for r in routed)
            chunks = sum(t.output_tokens for r in routed for t in r.traces)
            points.append(Point(c, direct, routed, cpu_routed, reqs, chunks, label=" (route)"))
            print_point(points[-1])
    return points


def run(args: argparse.Namespace) -> None:
    """Start the replica and kvgate as pinned child processes, measure, stop them."""
    if args.pace_ms is not None:
        sim_cmd = [*_taskset(1), sys.executable, "-m", "loadtests.paced_replica", "--port", "0",
                   "--pace-ms", str(args.pace_ms), "--model", MODEL]  # fmt: skip
    else:
        sim_cmd = [*_taskset(1), sys.executable, "-m", "gateway.cli", "sim", "--replicas", "1", "--port", "0",
                   "--profile", "tiny", "--time-scale", str(args.time_scale)]  # fmt: skip
    with contextlib.ExitStack() as stack:
        sim, sim_url = stack.enter_context(child(sim_cmd, "http://"))
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        # Flow control off: with one replica and 200 streams it would (by design) hold requests past
        # max_in_flight_per_replica at the gateway; this benchmark measures the proxy's own cost.
        cfg = {"replicas": [{"url": sim_url, "model": MODEL, "name": "r0"}],
               "flow_control": {"enabled": False},
               "server": {"access_log": False},
               "routes": [{"name": ROUTE, "targets": [{"model": MODEL, "weight": 1}]}]}  # fmt: skip
        gw_args = []
        if args.workers is not None:
            from loadtests.redis_process import RedisServer

            redis = RedisServer()
            stack.callback(redis.close)
            redis.start()
            cfg["state"] = {"store": redis.url}
            gw_args = ["--workers", str(args.workers)]
        cfg_path = Path(tmp) / "kvgate.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        gw_cmd = [*_taskset(args.gateway_cpus), sys.executable, "-m", "gateway.cli", "serve",
                  "--config", str(cfg_path), "--port", str(args.gateway_port), *gw_args]  # fmt: skip
        gw = subprocess.Popen(gw_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            asyncio.run(measure(args, sim_url, f"http://127.0.0.1:{args.gateway_port}", gw.pid, sim.pid))
        finally:
            gw.terminate()
            gw.wait(30)


def print_point(p: Point) -> None:
    ms = 1000.0
    d50, d99 = _pct(p.direct, "ttft", "p50"), _pct(p.direct, "ttft", "p99")
    g50, g99 = _pct(p.gateway, "ttft", "p50"), _pct(p.gateway, "ttft", "p99")
    e_d, e_g = _pct(p.direct, "e2e", "p50"), _pct(p.gateway, "e2e", "p50")
    rps_d = sum(r.summarize().requests_s for r in p.direct) / len(p.direct)
    rps_g = sum(r.summarize().requests_s for r in p.gateway) / len(p.gateway)
    errors = sum(r.summarize().errors for r in p.gateway + p.direct)
    kinds: dict[str, int] = {}
    for label, runs in (("direct", p.direct), ("kvgate", p.gateway)):
        for r in runs:
            for kind, n in r.summarize().error_kinds.items():
                kinds[f"{label}:{kind}"] = kinds.get(f"{label}:{kind}", 0) + n
    cpu_req = p.gw_cpu_s / max(1, p.gw_requests) * 1e6
    per_core = p.gw_chunks / p.gw_cpu_s if p.gw_cpu_s > 0 else float("nan")
    print(
        f"| {p.concurrency}{p.label} | {d50 * ms:.2f} / {d99 * ms:.2f} | {g50 * ms:.2f} / {g99 * ms:.2f} "
        f"| {(g50 - d50) * ms:+.2f} / {(g99 - d99) * ms:+.2f} | {e_d * ms:.1f} / {e_g * ms:.1f} "
        f"| {rps_d:.0f} / {rps_g:.0f} | {cpu_req:.0f} | {per_core:,.0f} | {errors} {kinds or ''} |",
        flush=True,
    )
    if p.wall_s > 0:
        loadgen = sum(r.loadgen.cpu_s for r in p.gateway)
        print(
            f"  through kvgate: kvgate {p.gw_cpu_s / p.wall_s:.2f} cores, replica "
            f"{p.sim_cpu_s / p.wall_s:.2f}, load generator {loadgen / p.wall_s:.2f}; "
            f"{p.gw_chunks / p.wall_s:,.0f} chunks/s",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--concurrency", default="1,50,200", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--requests", type=int, default=2000, help="requests per run (at least 4x concurrency)")
    p.add_argument("--repeats", type=int, default=2, help="direct/gateway run pairs per concurrency")
    p.add_argument("--chunks", type=int, default=32, help="output tokens = stream chunks per request")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--time-scale", type=float, default=0.001, help="simulator time scale (near 0)")
    p.add_argument("--max-seconds", type=float, default=120.0)
    p.add_argument("--gateway-port", type=int, default=18080)
    p.add_argument("--route", action="store_true", help="also send each load to a route (model rewrite on)")
    p.add_argument("--pace-ms", type=float, default=None,
                   help="chunks this many ms apart (loadtests.paced_replica), not the simulator")
    p.add_argument("--gateway-cpus", default="0",
                   help="CPUs kvgate may run on (taskset list; default 0; the others use 1)")  # fmt: skip
    p.add_argument("--workers", type=int, default=None,
                   help="kvgate serve --workers N (limits in a private redis-server)")  # fmt: skip
    args = p.parse_args(argv)
    if args.route:
        plain, rewriting = rewrite_micro()
        print(f"model rewrite, per relayed chunk (in-process): SSE filter {plain:.0f} ns, with the rewrite "
              f"{rewriting:.0f} ns: +{rewriting - plain:.0f} ns")  # fmt: skip
    print("| streams | TTFT p50 / p99 direct (ms) | TTFT p50 / p99 via kvgate (ms) | added p50 / p99 (ms) "
          "| e2e p50 direct / kvgate (ms) | req/s direct / kvgate | kvgate CPU µs/request "
          "| chunks relayed per core-second | errors |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
