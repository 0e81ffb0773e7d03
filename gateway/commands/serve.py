"""`kvgate serve --config FILE [--host H] [--port P]`: run the gateway in front of configured replicas
(a static `replicas:` list, `discovery:`, or both)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument("--host", default=None, help="listen address (default: server.host from config)")
    p.add_argument("--port", type=int, default=None, help="listen port (default: server.port from config)")


def run(args: argparse.Namespace) -> int:
    from gateway.config import ConfigError
    from gateway.config_file import ConfigFile
    from gateway.replica_auth import ReplicaCredentials
    from gateway.server import serve_forever

    config_file = ConfigFile(args.config)  # read again on SIGHUP, POST /admin/reload, or when watched
    try:
        config = config_file.load()  # the same checks as every command (config_check)
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
    return serve_forever(
        config,
        args.host or config.server.host,
        args.port if args.port is not None else config.server.port,
        config_file,
    )
