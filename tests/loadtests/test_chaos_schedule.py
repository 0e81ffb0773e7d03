"""The chaos benchmark's fault timeline."""

from __future__ import annotations

import itertools

import pytest

from loadtests.chaos_schedule import KINDS, PROCESS_FAULTS, SIM_FAULTS, build_schedule
from simulator.server.faults import FaultConfig


def test_every_kind_comes_once_per_cycle_with_a_calm_stretch_after_each() -> None:
    s = build_schedule(duration_s=20 + 40 * len(KINDS), replicas=3, phase_s=40, on_fraction=0.5, warmup_s=20)
    assert [w.kind for w in s] == list(KINDS)
    for a, b in itertools.pairwise(s):
        assert a.end_s - a.start_s == 20
        assert b.start_s - a.end_s == 20  # the fleet recovers before the next fault
    assert s[0].start_s == 20


def test_replica_faults_rotate_over_the_replicas_and_redis_or_calm_name_none() -> None:
    s = build_schedule(duration_s=1000, replicas=3, phase_s=10)
    victims = [w.replica for w in s if w.kind not in ("kill_redis", "calm")]
    assert set(victims) == {0, 1, 2}
    assert all(w.replica is None for w in s if w.kind in ("kill_redis", "calm"))


def test_no_phase_runs_past_the_end() -> None:
    s = build_schedule(duration_s=95, replicas=2, phase_s=40, warmup_s=20)
    assert [w.start_s for w in s] == [20]  # the second phase would end at 100


def test_refuses_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="at least 2 replicas"):
        build_schedule(100, replicas=1)
    with pytest.raises(ValueError, match="on_fraction"):
        build_schedule(100, replicas=2, on_fraction=1.0)
    with pytest.raises(ValueError, match="unknown fault kinds"):
        build_schedule(100, replicas=2, kinds=("meteor",))


@pytest.mark.parametrize("kind", sorted(SIM_FAULTS))
def test_every_simulator_fault_is_one_the_simulator_accepts(kind: str) -> None:
    FaultConfig().merged(SIM_FAULTS[kind])  # raises on an unknown field or a bad value


def test_every_kind_is_either_a_simulator_fault_a_process_fault_or_calm() -> None:
    assert set(KINDS) == set(SIM_FAULTS) | PROCESS_FAULTS | {"calm"}
