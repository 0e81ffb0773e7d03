"""The `kvgate` command: one entry point, one sub-command per job.

Each sub-command's module is imported only when it runs, so `kvgate sim` does not pay for the gateway
and `kvgate check-config` does not start an event loop.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module, help). Each module exposes `add_arguments(parser)` and `run(args) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "up": ("gateway.commands.up", "run a simulated fleet with kvgate in front of it (the embedded default)"),
    "serve": ("gateway.commands.serve", "run kvgate in front of the replicas in a config file"),
    "check-config": ("gateway.commands.check_config", "validate a config file"),
    "hash-key": ("gateway.commands.hash_key", "print the hashed form of an API key for the config"),
    "usage": ("gateway.commands.usage", "print the usage ledger of a running gateway as a table (or CSV)"),
    "sim": ("simulator.cli", "serve a simulated vLLM fleet"),
    "bench": ("gateway.commands.bench", "compare routing policies side by side on a simulated fleet"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = importlib.import_module(args._module).run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
