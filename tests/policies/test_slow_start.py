"""policies/slow_start.py and the slow-start and in-service filters, as tables."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.scheduling.context import SchedulingContext
from policies.scheduling.filters.in_service import InServiceFilter
from policies.scheduling.filters.slow_start import SlowStartFilter
from policies.slow_start import keeps, slow_start_weight
from policies.types import ReplicaPhase, ReplicaState, RequestInfo

R = ReplicaState(name="r", url="http://r", pool="m")
REQUEST = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=1, max_tokens=1)


@pytest.mark.parametrize(
    ("age", "ramp", "weight"),
    [
        (0.0, 0.0, 1.0),  # no ramp configured
        (5.0, -1.0, 1.0),
        (0.0, 10.0, 0.1),  # the floor at the start
        (-3.0, 10.0, 0.1),  # clock skew counts as age 0
        (0.5, 10.0, 0.1),
        (5.0, 10.0, 0.5),  # linear
        (9.9, 10.0, 0.99),
        (10.0, 10.0, 1.0),  # done
        (50.0, 10.0, 1.0),
    ],
)
def test_weight(age: float, ramp: float, weight: float) -> None:
    assert slow_start_weight(age, ramp) == pytest.approx(weight)


def test_min_weight_is_checked() -> None:
    with pytest.raises(ValueError):
        slow_start_weight(1.0, 10.0, min_weight=0.0)


@pytest.mark.parametrize("weight", [0.1, 0.25, 0.5, 0.9])
def test_keeps_a_weight_share_of_any_run_of_requests(weight: float) -> None:
    for start in (0, 137, 10_000):
        kept = sum(keeps(seq, "vllm-7", weight) for seq in range(start, start + 1000))
        assert abs(kept - 1000 * weight) <= 10


def test_keeps_never_and_always() -> None:
    assert not any(keeps(s, "a", 0.0) for s in range(100))
    assert all(keeps(s, "a", 1.0) for s in range(100))


def ctx(now: float, sequence: int) -> SchedulingContext:
    return SchedulingContext(request=REQUEST, now=now, prefix_match={}, prefix_blocks=0, sequence=sequence)


def test_slow_start_filter_thins_only_the_ramping_replica() -> None:
    old = replace(R, name="old")
    new = replace(R, name="new", ready_since=100.0, slow_start_s=10.0)
    f = SlowStartFilter()
    counts = {"old": 0, "new": 0}
    for seq in range(1000):
        for r in f.filter(ctx(102.5, seq), [old, new]):  # 25% into the ramp
            counts[r.name] += 1
    assert counts["old"] == 1000
    assert abs(counts["new"] - 250) <= 10
    assert f.filter(ctx(111.0, 3), [old, new]) == [old, new]  # ramp over
    assert f.filter(ctx(100.0, 3), [old]) == [old]


def test_in_service_filter_keeps_only_ready_replicas() -> None:
    ready = replace(R, name="a")
    not_ready = replace(R, name="b", phase=ReplicaPhase.NOT_READY)
    terminating = replace(R, name="c", phase=ReplicaPhase.TERMINATING)
    f = InServiceFilter()
    assert not f.soft
    everyone = [ready, not_ready, terminating]
    assert f.filter(ctx(0, 0), everyone) == [ready]
    assert f.filter(ctx(0, 0), [ready]) == [ready]
