"""The membership filters' fast paths keep exactly the candidates their plain definitions keep.

Each filter returns its input unchanged when every candidate passes (no new list on the common path)
and otherwise filters as before; on random pools the kept replicas, in order, must equal the plain
comprehension's, and an all-pass pool must come back as the same object.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.scheduling.context import SchedulingContext
from policies.scheduling.contracts import Filter
from policies.scheduling.filters.fresh import FreshFilter
from policies.scheduling.filters.healthy import HealthyFilter
from policies.scheduling.filters.in_service import InServiceFilter
from policies.scheduling.filters.serves_model import ServesModelFilter
from policies.scheduling.filters.slow_start import SlowStartFilter
from policies.slow_start import keeps, slow_start_weight
from policies.types import ReplicaPhase, ReplicaState
from tests.policies.scheduling.builders import NOW, context, replica

Reference = Callable[[SchedulingContext, Sequence[ReplicaState]], list[ReplicaState]]


def fresh(ctx: SchedulingContext, c: Sequence[ReplicaState]) -> list[ReplicaState]:
    return [r for r in c if r.scraped_at is not None and ctx.now - r.scraped_at <= ctx.stale_after_s]


def healthy(ctx: SchedulingContext, c: Sequence[ReplicaState]) -> list[ReplicaState]:
    return [r for r in c if r.healthy]


def in_service(ctx: SchedulingContext, c: Sequence[ReplicaState]) -> list[ReplicaState]:
    return [r for r in c if r.in_service]


def serves_model(ctx: SchedulingContext, c: Sequence[ReplicaState]) -> list[ReplicaState]:
    return [r for r in c if r.pool == ctx.request.base_model]


def slow_start(ctx: SchedulingContext, c: Sequence[ReplicaState]) -> list[ReplicaState]:
    floor = SlowStartFilter().min_weight
    return [
        r
        for r in c
        if r.ready_since is None
        or keeps(ctx.sequence, r.name, slow_start_weight(ctx.now - r.ready_since, r.slow_start_s, floor))
    ]


CASES: list[tuple[Filter, Reference]] = [
    (FreshFilter(), fresh),
    (HealthyFilter(), healthy),
    (InServiceFilter(), in_service),
    (ServesModelFilter(), serves_model),
    (SlowStartFilter(), slow_start),
]

replicas = st.builds(
    lambda i, healthy, pool, age, phase, ramp: replica(
        f"r{i}",
        healthy=healthy,
        pool=pool,
        scraped_at=None if age is None else NOW - age,
        phase=phase,
        ready_since=None if ramp is None else NOW - ramp,
        slow_start_s=30.0,
    ),
    st.integers(0, 40),
    st.booleans(),
    st.sampled_from(["m", "other"]),
    st.one_of(st.none(), st.floats(-1.0, 3.0), st.just(math.nan), st.just(math.inf)),
    st.sampled_from(list(ReplicaPhase)),
    st.one_of(st.none(), st.floats(0.0, 60.0)),
)


@settings(max_examples=400, deadline=None)
@given(pool=st.lists(replicas, max_size=20), sequence=st.integers(0, 1000))
def test_each_filter_keeps_what_its_definition_keeps(pool: list[ReplicaState], sequence: int) -> None:
    ctx = context(sequence=sequence)
    for f, reference in CASES:
        kept = f.filter(ctx, tuple(pool))
        assert list(kept) == reference(ctx, pool), f


def test_an_all_pass_pool_comes_back_as_is() -> None:
    pool = tuple(replica(f"r{i}") for i in range(16))
    ctx = context()
    for f, _ in CASES:
        assert f.filter(ctx, pool) is pool, f
