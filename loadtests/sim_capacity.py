"""How much load one simulator process carries before its own CPU distorts the timings it reports.

Starts `kvgate sim` (one replica) pinned to one core (`taskset`), pins this load generator to another,
and for each time scale runs closed-loop streaming at increasing concurrency. Per level it reports:

- streams: concurrent streaming requests, each restarted as soon as it ends;
- chunks/s received, and the client's own CPU (it must stay well below one core);
- the simulator process's CPU (100% = one core) and its CPU microseconds per chunk, all included;
- stretch: wall time the engine took per step over the time it should have taken (the sum of step
  durations times the time scale), minus 1. 0% is faithful; it grows once the simulator falls behind;
- mean and p99 step lag (wall ms a step started after its deadline) and clock jumps (simulated seconds
  the engine clock skipped because the driver fell too far behind);
- ITL / step: the client's mean gap between reads (wall) over the engine's mean step time (wall);
- the machine's 1-minute load average: on a shared machine, distortion while the simulator's CPU is low
  means other processes held the core, not that the simulator ran out of it.

Each stream draws its output length uniformly from [max_tokens/2, 3*max_tokens/2] so that streams do
not finish (and prefill) in lockstep. A level waits until every stream has received a chunk, then
`--warmup` seconds, then measures `--duration` seconds.

Usage: python -m loadtests.sim_capacity [--profile llama-3-8b-h100] [--time-scales 1,10]
       [--concurrency 1,16,64,128,256,512,1024] [--duration 8] [--max-tokens 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

_TICK = os.sysconf("SC_CLK_TCK")
_HEADERS = {"content-type": "application/json"}


@dataclass(frozen=True)
class Level:
    time_scale: float
    streams: int
    chunks_per_s: float
    requests_per_s: float
    sim_cpu: float
    cpu_us_per_chunk: float
    client_cpu: float
    step_ms: float
    stretch: float
    lag_mean_ms: float
    lag_p99_ms: float
    clock_jump_s: float
    itl_ratio: float
    load_avg: float


@dataclass
class Counts:
    """What the client saw; chunks and gaps only while `recording`."""

    chunks: int = 0
    requests: int = 0
    gaps: float = 0.0
    gap_count: int = 0
    started: int = 0
    recording: bool = False


@dataclass(frozen=True)
class Snapshot:
    metrics: dict[str, float]
    sim_cpu_s: float
    client_cpu_s: float
    wall_s: float


class SimProcess:
    """`kvgate sim` in a subprocess, pinned to one CPU core when `taskset` exists."""

    def __init__(self, profile: str, time_scale: float, core: int | None, max_num_seqs: int) -> None:
        command = [sys.executable, "-m", "gateway.cli", "sim", "--replicas", "1", "--port", "0",
                   "--profile", profile, "--time-scale", str(time_scale), "--max-num-seqs", str(max_num_seqs)]
        if core is not None and shutil.which("taskset"):
            command = ["taskset", "-c", str(core), *command]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().strip()
        if not self.url.startswith("http"):
            self.stop()
            raise RuntimeError("the simulator did not start")

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.process.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The simulator's own series (step-lag buckets keyed `lag_le_<bound>`) and the running gauge."""
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "kvgate_sim_step_lag_seconds_bucket":
                out["lag_le_" + s.labels["le"]] = s.value
            elif s.name.startswith("kvgate_sim_") or s.name == "vllm:num_requests_running":
                out[s.name] = s.value
    return out


async def snapshot(session: aiohttp.ClientSession, sim: SimProcess) -> Snapshot:
    metrics = await scrape(session, sim.url)
    return Snapshot(metrics, sim.cpu_seconds(), time.process_time(), time.perf_counter())


async def stream_forever(session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int,
                         counts: Counts, rng: random.Random) -> None:
    first = True
    while True:
        body = json.dumps({"prompt": prompt, "stream": True,
                           "max_tokens": rng.randint(max(1, max_tokens // 2), max_tokens * 3 // 2)})
        async with session.post(url + "/v1/completions", data=body, headers=_HEADERS) as response:
            last = None
            async for data in response.content.iter_any():
                now = time.perf_counter()
                if first:
                    counts.started += 1
                    first = False
                if counts.recording:
                    n = data.count(b"data: ")
                    counts.chunks += n
                    if last is not None and n:
                        counts.gaps += now - last
                        counts.gap_count += 1
                last = now
        if counts.recording:
            counts.requests += 1


def lag_quantile(before: dict[str, float], after: dict[str, float], q: float) -> float:
    """Upper bound (seconds) of the step-lag bucket holding quantile `q` of the window's steps."""
    keys = [k for k in after if k.startswith("lag_le_")]
    buckets = sorted((float(k[len("lag_le_"):]), after[k] - before.get(k, 0.0)) for k in keys)
    total = buckets[-1][1] if buckets else 0.0
    for bound, cumulative in buckets:
        if total and cumulative >= q * total:
            return bound
    return 0.0


async def measure(sim: SimProcess, scale: float, streams: int, args: argparse.Namespace) -> Level:
    prompt = "The quick brown fox jumps over the lazy dog " * (args.prompt_words // 9 + 1)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        counts = Counts()
        rng = random.Random(streams)
        tasks = [asyncio.ensure_future(stream_forever(session, sim.url, f"{i} {prompt}", args.max_tokens,
                                                      counts, rng)) for i in range(streams)]
        while counts.started < streams:  # noqa: ASYNC110 - polling counters the streams update
            await asyncio.sleep(0.05)
        await asyncio.sleep(args.warmup)
        before = await snapshot(session, sim)
        counts.recording = True
        await asyncio.sleep(args.duration)
        counts.recording = False
        after = await snapshot(session, sim)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _ in range(200):  # let the aborts drain before the next level
            if (await scrape(session, sim.url)).get("vllm:num_requests_running", 0) == 0:
                break
            await asyncio.sleep(0.05)
    return level(scale, streams, counts, before, after)


def level(scale: float, streams: int, counts: Counts, before: Snapshot, after: Snapshot) -> Level:
    wall = after.wall_s - before.wall_s
    sim_cpu = after.sim_cpu_s - before.sim_cpu_s

    def delta(name: str) -> float:
        return after.metrics.get(name, 0.0) - before.metrics.get(name, 0.0)

    steps = delta("kvgate_sim_steps_total")
    busy = delta("kvgate_sim_busy_wall_seconds_total")
    lag_count = delta("kvgate_sim_step_lag_seconds_count")
    step_wall = busy / steps if steps else 0.0
    itl = counts.gaps / counts.gap_count if counts.gap_count else 0.0
    return Level(
        time_scale=scale, streams=streams, chunks_per_s=counts.chunks / wall,
        requests_per_s=counts.requests / wall, sim_cpu=sim_cpu / wall,
        cpu_us_per_chunk=1e6 * sim_cpu / counts.chunks if counts.chunks else 0.0,
        client_cpu=(after.client_cpu_s - before.client_cpu_s) / wall, step_ms=1e3 * step_wall,
        stretch=wall / busy - 1.0 if busy else 0.0,
        lag_mean_ms=1e3 * delta("kvgate_sim_step_lag_seconds_sum") / lag_count if lag_count else 0.0,
        lag_p99_ms=1e3 * lag_quantile(before.metrics, after.metrics, 0.99),
        clock_jump_s=delta("kvgate_sim_clock_jump_seconds_total"),
        itl_ratio=itl / step_wall if step_wall else 0.0, load_avg=os.getloadavg()[0],
    )


def table(levels: list[Level]) -> str:
    lines = ["| time scale | streams | chunks/s | req/s | sim CPU | CPU µs/chunk | client CPU "
             "| step (wall ms) | stretch | lag mean ms | lag p99 ms | clock jumps (sim s) | ITL / step "
             "| load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in levels:
        lines.append(
            f"| {x.time_scale:g} | {x.streams} | {x.chunks_per_s:,.0f} | {x.requests_per_s:,.1f} "
            f"| {x.sim_cpu:.0%} | {x.cpu_us_per_chunk:.0f} | {x.client_cpu:.0%} | {x.step_ms:.1f} "
            f"| {x.stretch:+.1%} | {x.lag_mean_ms:.2f} | {x.lag_p99_ms:g} | {x.clock_jump_s:.2f} "
            f"| {x.itl_ratio:.2f} | {x.load_avg:.1f} |")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> list[Level]:
    levels: list[Level] = []
    for scale in args.time_scales:
        sim = SimProcess(args.profile, scale, args.sim_core, args.max_num_seqs)
        try:
            for streams in args.concurrency:
                result = await measure(sim, scale, streams, args)
                levels.append(result)
                print(table([result]).splitlines()[-1], flush=True)
        finally:
            sim.stop()
    return levels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--profile", default="llama-3-8b-h100")
    parser.add_argument("--time-scales", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 10.0])
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 16, 64, 128, 256, 512, 1024])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds measured per level")
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="seconds after every stream got its first chunk, before measuring")
    parser.add_argument("--max-tokens", type=int, default=200, help="mean output tokens per request")
    parser.add_argument("--prompt-words", type=int, default=80)
    parser.add_argument("--max-num-seqs", type=int, default=1024)
    parser.add_argument("--sim-core", type=int, default=0, help="core for the simulator (taskset)")
    parser.add_argument("--client-core", type=int, default=1, help="core for this load generator")
    parser.add_argument("--json", help="also write the levels as JSON here")
    args = parser.parse_args(argv)
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, {args.client_core})
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    with contextlib.suppress(ImportError):
        import uvloop

        factory = uvloop.new_event_loop
    print(table([]), flush=True)
    with asyncio.Runner(loop_factory=factory) as runner:
        levels = runner.run(run(args))
    print("\n" + table(levels))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(x) for x in levels], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
