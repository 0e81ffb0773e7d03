"""The gate benchmark's cases measure what their names say ("fits": no KV wait anywhere; "short":
every replica waits; "mixed": the first replica only has room), its `room` rows price the pool as
whole plays do, and the callgrind mode runs one row silently."""

from __future__ import annotations

import sys

import pytest

from loadtests import gate_bench
from loadtests.gate_bench import PROMPT, pool, runs


def waits(label: str) -> list[float]:
    keys = tuple(range(PROMPT // gate_bench.BLOCK))
    blocks = {"fits": 2048 * 8, "short": 2048, "mixed": 2048}[label]
    est, states = pool(3, 8, blocks, roomy_first=label == "mixed")
    return [est.kv_wait_s(s, PROMPT, keys, 0.5, 1.0) for s in states]


def test_the_cases_wait_as_named() -> None:
    assert all(w == 0.0 for w in waits("fits"))
    assert all(w > 0.0 for w in waits("short"))
    first, *others = waits("mixed")
    assert first == 0.0 and all(w > 0.0 for w in others)


@pytest.mark.parametrize("label", gate_bench.CASES)
def test_every_row_runs_and_the_cut_room_is_the_whole_one(label: str) -> None:
    rows = runs(label, 3, 8)  # asserts the `room` row's answer equals `room_whole`'s
    assert [name for name, _, _ in rows] == ["ttft_s", "gate_ttft_s", "room", "room_whole"]
    by_name = {name: fn for name, fn, _ in rows}
    assert by_name["room"]() == by_name["room_whole"]()


def test_the_callgrind_mode_runs_one_row_silently(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["gate_bench", "--only", "mixed:room", "--passes", "2", "--replicas", "3", "--in-flight", "8"]
    monkeypatch.setattr(sys, "argv", argv)
    gate_bench.main()
    assert capsys.readouterr().out == ""
