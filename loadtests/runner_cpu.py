"""How much CPU the load generator spends per request: is it ever the bottleneck at our loads?

Starts the replica simulator (`kvgate sim`) in a subprocess pinned to one core (or uses `--target`, any
OpenAI-compatible base URL, e.g. a gateway), pins this process (the runner, on uvloop) to another, and
drives closed-loop sweeps of the `random` workload. The specs are built before each level, so text
generation is not counted. For each level it prints requests/s, content chunks/s, the runner's CPU in
cores (thread CPU time / wall time) and its CPU per request and per chunk. Run from the repo root::

    python -m loadtests.runner_cpu --concurrency 1,16,64,256 --duration 5 --output-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Sequence

from loadtests.runner import LoadConfig, run_load
from loadtests.workloads.random_prompts import RandomWorkload

SIM_CORE, RUNNER_CORE = 1, 0


def start_simulator(time_scale: float, max_num_seqs: int) -> tuple[subprocess.Popen[str], str]:
    command = [
        sys.executable, "-m", "gateway.cli", "sim", "--replicas", "1", "--port", "0", "--profile", "tiny",
        "--time-scale", str(time_scale), "--max-num-seqs", str(max_num_seqs), "--log-level", "warning",
    ]  # fmt: skip
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        command = ["taskset", "-c", str(SIM_CORE), *command]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    if not url.startswith("http"):
        process.kill()
        raise RuntimeError("the simulator did not start")
    return process, url


async def sweep(url: str, args: argparse.Namespace) -> None:
    print("| concurrency | requests | req/s | chunks/s | loadgen cores | CPU ms / req | CPU µs / chunk |")
    print("|---|---|---|---|---|---|---|")
    for concurrency in args.concurrency:
        # Enough requests for ~2,000 req/s; built up front so the run times only the runner.
        work = RandomWorkload(
            requests=int(2_000 * args.duration), prompt_tokens=args.prompt_tokens,
            output_tokens=args.output_tokens, model=args.model, seed=concurrency,
        )  # fmt: skip
        specs = list(work.requests())
        config = LoadConfig(concurrency=concurrency, duration_s=args.duration, drain_timeout_s=30)
        run = await run_load(url, specs, config)
        chunks = sum(len(t.chunk_times) for t in run.traces)
        errors = sum(1 for t in run.traces if not t.ok)
        use = run.loadgen
        print(
            f"| {concurrency} | {run.sent} | {run.sent / run.wall_s:,.0f} | {chunks / run.wall_s:,.0f} | "
            f"{use.cpu_frac:.2f}{' ⚠' if use.bottleneck else ''} | {use.cpu_ms_per_request:.3f} | "
            f"{1e6 * use.cpu_s / max(chunks, 1):.1f} |" + (f" {errors} errors" if errors else ""),
            flush=True,
        )


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.runner_cpu", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per level")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--time-scale", type=float, default=1.0, help="the simulator's time scale")
    parser.add_argument("--target", help="base URL of a running server instead of starting the simulator")
    parser.add_argument("--model", default="tiny-llama")
    args = parser.parse_args(argv)
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {RUNNER_CORE})
    process: subprocess.Popen[str] | None = None
    if args.target:
        url = args.target
    else:
        process, url = start_simulator(args.time_scale, max(args.concurrency))
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(sweep(url, args))
    finally:
        if process is not None:
            process.terminate()
            process.wait(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
