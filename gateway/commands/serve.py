"""`kvgate serve --config FILE [--host H] [--port P] [--workers N]`: run the gateway in front of
configured replicas (a static `replicas:` list, `discovery:`, or both).

With more than one worker (`--workers`, else `server.workers`), this process becomes the
supervisor of N worker processes sharing the port (gateway/supervisor.py); each worker is this same
command, told its slot through the environment (gateway/worker_group.py).
"""

from __future__ import annotations

import argparse
import sys


def _workers(text: str) -> int:
    from gateway.config import MAX_WORKERS

    n = int(text)
    if not 1 <= n <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_WORKERS}")
    return n


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument("--host", default=None, help="listen address (default: server.host from config)")
    p.add_argument("--port", type=int, default=None, help="listen port (default: server.port from config)")
    p.add_argument(
        "--workers",
        type=_workers,
        default=None,
        help="processes accepting on the port, under a supervising parent (Linux; default: "
        "server.workers from config, 1). Above 1 the limits must be shared through Redis",
    )


def run(args: argparse.Namespace) -> int:
    from gateway.config import Config, ConfigError, workers_problem
    from gateway.config_file import ConfigFile
    from gateway.replica_auth import ReplicaCredentials
    from gateway.server import serve_forever
    from gateway.worker_group import WorkerSlot

    config_file = ConfigFile(args.config)  # read again on SIGHUP, POST /admin/reload, or when watched
    if args.workers is not None:
        n = args.workers

        def with_workers(file_config: Config) -> Config:
            """The command line's worker count over the file's, at start and at every reload."""
            return file_config.model_copy(
                update={"server": file_config.server.model_copy(update={"workers": n})}
            )

        config_file.adjust = with_workers
    try:
        config = config_file.load()  # the same checks as every command (config_check)
        problem = workers_problem(config, config.server.workers)
        if problem is not None:
            raise ConfigError(problem)
        ReplicaCredentials.from_config(config)  # an unset variable stops here, not inside the server
    except ConfigError as err:
        print(f"kvgate: invalid config {args.config}:\n{err}", file=sys.stderr)
        return 2
    if not config.replicas and not config.discovery.configured:
        print(
            "kvgate serve: the config names no replicas and no discovery "
            "(use `kvgate up` for a simulated fleet)",
            file=sys.stderr,
        )
        return 2
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    workers = config.server.workers
    slot = WorkerSlot.from_env()
    if slot is None and workers > 1:
        if sys.platform != "linux":
            print(
                "kvgate serve: several workers need Linux (SO_REUSEPORT spreads connections)", file=sys.stderr
            )
            return 2
        if port == 0:
            print("kvgate serve: several workers need a fixed port (not 0)", file=sys.stderr)
            return 2
        from gateway.supervisor import supervise

        return supervise(config, args.config, host, port)
    return serve_forever(config, host, port, config_file, slot)
