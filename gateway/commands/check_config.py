"""`kvgate check-config FILE`: validate a config the way `serve` would, and say what is wrong."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="YAML config file")


def run(args: argparse.Namespace) -> int:
    from gateway.config import ConfigError
    from gateway.config_check import config_warnings, load_checked

    try:
        config = load_checked(args.file)
    except ConfigError as err:
        print(f"{args.file}: invalid\n{err}", file=sys.stderr)
        return 1
    for warning in config_warnings(config):
        print(f"{args.file}: warning: {warning}", file=sys.stderr)
    print(
        f"{args.file}: ok ({len(config.replicas)} replicas, {len(config.tenants)} tenants, "
        f"profile {config.scheduling.profile!r})"
    )
    return 0
