"""`free_port`: a loopback port for a process the caller starts next, chosen so that nothing else on
the machine can take it meanwhile.

A port the kernel picks (bind to port 0, close, hand the number on) comes from its ephemeral range,
which every new outgoing connection and every other port-0 listener draws from too: between the
check and the child's own bind, another process may take it, and the child then dies on "address
already in use" (seen under parallel load in the test suite). Here the port is picked at random
below the ephemeral range, where the kernel never hands out ports on its own, and checked free; a
random pick among ~12,000 keeps two callers in parallel from choosing the same one. Where the
ephemeral range leaves no room below it, the kernel's pick is the fallback.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Sequence
from pathlib import Path

FLOOR = 20_000  # below it, well-known services; 20,000 up to the ephemeral range is left to us
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_rng = random.Random()  # unseeded: parallel callers (test workers) must not pick alike


def ephemeral_low(path: Path = _RANGE_FILE) -> int:
    """The lowest port of the kernel's ephemeral range (Linux's default 32,768 where unreadable)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _bindable(port: int, hosts: Sequence[str], kind: int = socket.SOCK_STREAM) -> bool:
    for host in hosts:
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def free_port(
    host: str = "127.0.0.1",
    also: Sequence[str] = (),
    low: int | None = None,
    *,
    udp: bool = False,
    run: int = 1,
) -> int:
    """A port free on `host` and on every address of `also` (for UDP with `udp`), below the
    ephemeral range that starts at `low` (read from the kernel by default); with `run` > 1, the first
    of that many consecutive ports all free (a fleet that binds `base_port`, `base_port + 1`, ...)."""
    hosts = (host, *also)
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    top = (ephemeral_low() if low is None else low) - (run - 1)
    if top - FLOOR >= 1_000:
        for _ in range(200):
            port = _rng.randrange(FLOOR, top)
            if all(_bindable(port + i, hosts, kind) for i in range(run)):
                return port
    for _ in range(20):  # no room below the ephemeral range (or all taken): the kernel's pick
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if _bindable(port, also, kind) and all(_bindable(port + i, hosts, kind) for i in range(1, run)):
            return port
    raise RuntimeError(f"no port free on all of {list(hosts)}")
