"""free_port: below the kernel's ephemeral range, free on every address asked, the kernel's pick
where there is no room below the range."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from loadtests import ports
from loadtests.ports import FLOOR, ephemeral_low, free_port


def scripted_picks(monkeypatch: pytest.MonkeyPatch, first: list[int]) -> list[int]:
    """Make free_port's random picks `first`, then real ones; returns the list of picks made."""
    asked: list[int] = []

    class Scripted(random.Random):
        def randrange(self, start: int, stop: int, *_: object) -> int:  # type: ignore[override]
            pick = first[len(asked)] if len(asked) < len(first) else random.randrange(start, stop)
            asked.append(pick)
            return pick

    monkeypatch.setattr(ports, "_rng", Scripted())
    return asked


def test_a_port_below_the_ephemeral_range_that_binds() -> None:
    low = ephemeral_low()
    for _ in range(20):
        port = free_port()
        if low - FLOOR >= 1_000:
            assert FLOOR <= port < low  # no port-0 bind or outgoing connection can be handed it
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        asked = scripted_picks(monkeypatch, [taken, taken])  # the port in use twice, then real ones
        port = free_port(low=65_535)
        assert port != taken and len(asked) >= 3


def test_free_on_every_address_asked() -> None:
    port = free_port("127.0.0.1", also=["127.0.0.2"])
    for host in ("127.0.0.1", "127.0.0.2"):
        with socket.socket() as s:
            s.bind((host, port))


def test_no_room_below_the_range_falls_back_to_the_kernels_pick() -> None:
    port = free_port(low=FLOOR + 10)
    assert port > 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_the_range_is_read_from_the_kernel_or_defaults(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t60999\n")
    assert ephemeral_low(f) == 40_000
    f.write_text("nonsense")
    assert ephemeral_low(f) == 32_768
    assert ephemeral_low(tmp_path / "missing") == 32_768


def test_a_udp_port_below_the_range_that_binds_for_udp() -> None:
    low = ephemeral_low()
    port = free_port(udp=True)
    if low - FLOOR >= 1_000:
        assert FLOOR <= port < low
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", port))


def test_a_run_of_consecutive_ports_all_free_and_one_in_use_passed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for _ in range(10):
        base = free_port(run=3)
        assert base + 2 < ephemeral_low() or ephemeral_low() - FLOOR < 1_000
        for port in (base, base + 1, base + 2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
    # The pick's second port is in use: that pick is passed over.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        asked = scripted_picks(monkeypatch, [taken - 1])
        base = free_port(low=65_535, run=2)
        assert base != taken - 1 and len(asked) >= 2
