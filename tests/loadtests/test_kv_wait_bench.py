"""The KV-wait benchmark's cases measure what their names say: "fits" never waits (the early exit),
"full" plays the queue forward and waits; and the callgrind mode runs every case."""

from __future__ import annotations

import sys

import pytest

from loadtests import kv_wait_bench
from loadtests.kv_wait_bench import CASES, capacity, ledger, read


@pytest.mark.parametrize(("n", "label"), CASES)
def test_fits_never_waits_and_full_waits(n: int, label: str) -> None:
    wait, _ = read(ledger(n), capacity(n, label))
    assert (wait == 0.0) if label == "fits" else (wait > 0.0)


def test_the_phase_mode_runs_every_case_silently(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["kv_wait_bench", "--phases", "2"])
    kv_wait_bench.main()
    assert capsys.readouterr().out == ""  # the phase mode prints nothing: callgrind's dumps are its output
