"""`kvgate up`: the embedded default — a simulated vLLM fleet and kvgate in front of it, in one command.

The simulated fleet starts only when the config names neither replicas nor discovery.

The fleet runs as a child process (`kvgate sim`) so the simulator and the gateway each get their own
core; kvgate runs here with in-memory state. Ctrl-C drains kvgate (gateway/drain.py), then stops both;
a second Ctrl-C stops them at once.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config import Config, SimulatorConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", default=None, help="YAML config (without replicas: the simulated fleet is used)"
    )
    p.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (default 8080)")
    p.add_argument("--replicas", type=int, default=None, help="simulated replicas (default 4)")
    p.add_argument("--profile", default=None, help="simulator model/GPU profile (default llama-3-8b-h100)")
    p.add_argument("--time-scale", type=float, default=None, help="simulator time scale (>1 is slower)")


def run(args: argparse.Namespace) -> int:
    from gateway.config import ConfigError
    from gateway.config_check import load_checked
    from gateway.config_file import ConfigFile
    from gateway.embedded_fleet import EmbeddedFleet, FleetStartError, with_simulated_replicas
    from gateway.replica_auth import ReplicaCredentials
    from gateway.server import serve_forever

    config_file = ConfigFile(args.config) if args.config is not None else None
    try:
        config = config_file.load() if config_file is not None else load_checked(None)
        ReplicaCredentials.from_config(config)  # an unset variable stops here, not inside the server
    except ConfigError as err:
        print(f"kvgate: invalid config {args.config}:\n{err}", file=sys.stderr)
        return 2
    if config.server.workers > 1:
        print("kvgate up: runs one process; use `kvgate serve` for server.workers > 1", file=sys.stderr)
        return 2
    sim = _simulator(config, args)
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    fleet: EmbeddedFleet | None = None
    try:
        if not config.replicas and not config.discovery.configured:
            fleet = EmbeddedFleet(sim)
            try:
                urls = fleet.start()
                events = fleet.kv_events
            except FleetStartError as err:
                print(f"kvgate up: the simulated fleet did not start: {err}", file=sys.stderr)
                return 1

            def with_fleet(file_config: Config) -> Config:
                """A reload of a file that names no replicas keeps the simulated ones (its simulator
                section changed: refused, the fleet was started with it)."""
                if file_config.replicas or file_config.discovery.configured:
                    return file_config
                return with_simulated_replicas(file_config, _simulator(file_config, args), urls, events)

            config = with_fleet(config)
            if config_file is not None:
                config_file.adjust = with_fleet
            print(f"simulated fleet: {len(urls)} x {sim.profile} (time scale {sim.time_scale})")
            for u in urls:
                print(f"  {u}")
        model = _a_model(config)
        print(banner(f"http://{host}:{port}", model), flush=True)
        return serve_forever(config, host, port, config_file)
    finally:
        if fleet is not None:
            fleet.stop()


def _simulator(config: Config, args: argparse.Namespace) -> SimulatorConfig:
    """The config's simulator section with the command line's overrides."""
    return config.simulator.model_copy(
        update={
            k: v
            for k, v in {
                "replicas": args.replicas,
                "profile": args.profile,
                "time_scale": args.time_scale,
            }.items()
            if v is not None
        }
    )


def _a_model(config: Config) -> str:
    """A model to show in the banner: the first static replica's, else a discovery source's."""
    if config.replicas:
        return config.replicas[0].model
    d = config.discovery
    for source in (d.kubernetes, d.dns):
        if source is not None and source.model:
            return source.model
    return "MODEL"


def banner(url: str, model: str) -> str:
    return f"""
kvgate is listening on {url}

  curl {url}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], "stream": true}}'

  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key="none")
  print(client.chat.completions.create(model="{model}",
        messages=[{{"role": "user", "content": "Hello!"}}]).choices[0].message.content)

  metrics: {url}/metrics    readiness: {url}/ready    Ctrl-C drains and stops everything (twice: at once).
"""
