"""`kvgate sim`: serve N simulated vLLM replicas on ports P ... P+N-1 until SIGINT/SIGTERM.

Prints one base URL per line (flushed) once every replica serves, so a parent process can read them.
`--port 0` picks free ports. With `--kv-events-port Q` each replica also publishes vLLM's KV-cache
events (PUB on Q+2i, replay ROUTER on Q+2i+1; 0 = free ports), and after the URLs one line per replica
says where: `kv-events pub=tcp://127.0.0.1:Q replay=tcp://127.0.0.1:Q+1`.

Faults given here apply to every replica; change them per replica at runtime with `POST /sim/faults`.
Importing this module is cheap: the server stack loads in `run`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=1, help="number of replicas (default 1)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000,
                        help="port of the first replica; replica i uses PORT+i; 0 = free ports "
                             "(default 8000)")
    parser.add_argument("--profile", default="tiny",
                        help="model/GPU profile: tiny, llama-3-8b-h100, llama-3-8b-h200, "
                             "llama-3-70b-h100-tp4, qwen3-32b-h200 (default tiny)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="wall seconds per simulated second; > 1 is slower (default 1)")
    parser.add_argument("--block-size", type=int, default=16, help="KV block size in tokens (default 16)")
    parser.add_argument("--kv-blocks", type=int, default=None,
                        help="KV blocks per replica (default: what the profile's GPU memory holds)")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="max sequences per batch (default 256)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192,
                        help="token budget per engine step (default 8192)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="context limit in tokens (default: the profile's)")
    parser.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    parser.add_argument("--max-loras", type=int, default=None,
                        help="max distinct LoRA adapters per batch "
                             "(default 1 with --adapters, else 0 = no LoRA)")
    parser.add_argument("--adapters", default="", help="comma-separated LoRA adapters loaded at start")
    parser.add_argument("--model", default=None, help="served model name (default: the profile's)")
    parser.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs")
    parser.add_argument("--kv-events-port", type=int, default=None,
                        help="publish KV-cache events as vLLM's --kv-events-config does: replica i on "
                             "PORT+2i (ZeroMQ PUB) and PORT+2i+1 (replay ROUTER); 0 = free ports "
                             "(default: no events)")
    parser.add_argument("--kv-events-topic", default="",
                        help="topic of the KV-event messages (default '', as vLLM)")
    parser.add_argument("--api-key", default=None,
                        help="as vllm serve --api-key: /v1/* requests need 'Authorization: Bearer KEY' "
                             "(default: $VLLM_API_KEY, as vLLM; unset = open)")
    faults = parser.add_argument_group("faults (every replica; change at runtime with POST /sim/faults)")
    faults.add_argument("--fault-error-rate", type=float, default=0.0,
                        help="fraction of generation requests answered with an error before the first byte")
    faults.add_argument("--fault-error-status", type=int, default=500,
                        help="status of those errors (500 or 503)")
    faults.add_argument("--fault-slowdown", type=float, default=1.0, help="factor on every step's duration")
    faults.add_argument("--fault-crash-after-chunks", type=int, default=None,
                        help="drop the connection after K stream chunks (0: before any byte)")
    faults.add_argument("--fault-hang-after-chunks", type=int, default=None,
                        help="stall after K stream chunks until the client gives up (0: never answer)")
    faults.add_argument("--fault-health-status", type=int, default=200, help="status of GET /health")
    faults.add_argument("--fault-seed", type=int, default=0, help="seed of the error-rate draws")
    parser.add_argument("--log-level", default="warning", help="Python log level (default warning)")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from simulator.fleet import SimFleet

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        fleet = SimFleet(**_fleet_kwargs(args))
    except ValueError as exc:
        print(f"kvgate sim: {exc}", file=sys.stderr)
        return 2

    async def serve() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await fleet.start()
        except (OSError, ValueError) as exc:
            print(f"kvgate sim: {exc}", file=sys.stderr)
            return 1
        try:
            kv = [f"kv-events pub={e.pub} replay={e.replay}" for e in fleet.kv_event_endpoints]
            lines = fleet.urls + kv
            print("\n".join(lines), flush=True)
            await stop.wait()
        finally:
            await fleet.stop()
        return 0

    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(serve())


def _fleet_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    import os

    from simulator.server.faults import FaultConfig

    adapters = tuple(a.strip() for a in args.adapters.split(",") if a.strip())
    max_loras = args.max_loras if args.max_loras is not None else (1 if adapters else 0)
    faults = FaultConfig(
        error_rate=args.fault_error_rate, error_status=args.fault_error_status, slowdown=args.fault_slowdown,
        crash_after_chunks=args.fault_crash_after_chunks, hang_after_chunks=args.fault_hang_after_chunks,
        health_status=args.fault_health_status,
    )
    return {
        "replicas": args.replicas, "profile": args.profile, "time_scale": args.time_scale, "host": args.host,
        "base_port": args.port, "block_size": args.block_size, "kv_blocks": args.kv_blocks,
        "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_model_len": args.max_model_len, "enable_prefix_caching": not args.no_prefix_caching,
        "max_loras": max_loras, "adapters": adapters, "model": args.model,
        "scheduling_policy": args.scheduling_policy, "faults": faults, "fault_seed": args.fault_seed,
        "api_key": args.api_key if args.api_key is not None else (os.environ.get("VLLM_API_KEY") or None),
        "kv_events_port": args.kv_events_port, "kv_events_topic": args.kv_events_topic,
    }
