"""`kvgate hash-key [KEY]`: print the `sha256:...` form of an API key for the config.

Reads the key from standard input when not given (so it stays out of the shell history), or makes
a new random key with `--new` and prints both.
"""

from __future__ import annotations

import argparse
import secrets
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("key", nargs="?", help="the API key (default: read one line from stdin)")
    p.add_argument("--new", action="store_true", help="generate a new random key and print it too")


def run(args: argparse.Namespace) -> int:
    from gateway.auth_keys import hash_key

    if args.new:
        key = "sk-kvgate-" + secrets.token_urlsafe(24)
        print(f"key:  {key}")
        print(f"hash: {hash_key(key)}")
        return 0
    key = args.key if args.key is not None else sys.stdin.readline().rstrip("\n")
    if not key:
        print("kvgate hash-key: empty key", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0
