import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from policies.scheduling.context import SchedulingContext
from policies.scheduling.filters.healthy import HealthyFilter
from policies.scheduling.pickers.max_score import MaxScorePicker
from policies.scheduling.profile import SchedulingProfile, WeightedScorer
from policies.types import ReplicaState
from tests.policies.scheduling.builders import context, names, replica


@dataclass(frozen=True)
class FixedScorer:
    """Scores each replica by a table; replicas missing from it score 0."""

    name: str
    table: dict[str, float] = field(default_factory=dict)

    def score(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[float]:
        return [self.table.get(r.name, 0.0) for r in candidates]


@dataclass(frozen=True)
class DropFilter:
    """Drops the replicas it names."""

    name: str
    drop: frozenset[str]
    soft: bool = False

    def filter(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[ReplicaState]:
        return [r for r in candidates if r.name not in self.drop]


class StepTimer:
    """A clock that advances one second per reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


CANDIDATES = [replica("a"), replica("b"), replica("c")]


def profile(*scorers: tuple[FixedScorer, float], filters: Sequence[DropFilter] = ()) -> SchedulingProfile:
    return SchedulingProfile(filters, [WeightedScorer(s, w) for s, w in scorers], MaxScorePicker())


def test_total_is_the_weighted_sum_and_the_best_wins() -> None:
    p = profile(
        (FixedScorer("x", {"a": 1.0, "b": 0.5}), 3.0),
        (FixedScorer("y", {"b": 1.0, "c": 1.0}), 2.0),
    )
    d = p.schedule(context(), CANDIDATES, random.Random(0))
    assert d.total == {"a": 3.0, "b": 3.5, "c": 2.0}
    assert names(d.ranked) == ["b", "a", "c"]
    assert d.replica is not None and d.replica.name == "b"
    assert d.scores == {"b": {"x": 0.5, "y": 1.0}}
    assert d.dropped == {}
    assert d.plugin_seconds == {}


@pytest.mark.parametrize(
    ("tables", "totals"),
    [
        # a constant column (same score for everyone) still counts in every total
        ([({"a": 0.5, "b": 0.5, "c": 0.5}, 2.0), ({"a": 1.0}, 1.0)], {"a": 2.0, "b": 1.0, "c": 1.0}),
        ([({"a": 1.0}, 1.0), ({"a": 0.5, "b": 0.5, "c": 0.5}, 2.0)], {"a": 2.0, "b": 1.0, "c": 1.0}),
        ([({"a": 7.0, "b": 7.0, "c": 7.0}, 3.0)], {"a": 3.0, "b": 3.0, "c": 3.0}),  # clamped to 1
        ([({}, 3.0), ({"a": -1.0, "b": -1.0, "c": -1.0}, 3.0)], {"a": 0.0, "b": 0.0, "c": 0.0}),
    ],
)
def test_constant_columns_count_too(
    tables: list[tuple[dict[str, float], float]], totals: dict[str, float]
) -> None:
    p = profile(*[(FixedScorer(f"s{i}", t), w) for i, (t, w) in enumerate(tables)])
    d = p.schedule(context(), CANDIDATES, random.Random(0), explain=True)
    assert d.total == totals
    assert d.scores["b"] == {f"s{i}": min(1.0, max(0.0, t.get("b", 0.0))) for i, (t, _) in enumerate(tables)}


def test_a_scorer_returning_the_wrong_count_is_a_bug() -> None:
    @dataclass(frozen=True)
    class Short:
        name: str = "short"

        def score(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[float]:
            return [1.0]

    p = SchedulingProfile([], [WeightedScorer(Short(), 1.0)], MaxScorePicker())
    with pytest.raises(ValueError, match="'short' returned 1 scores for 3 candidates"):
        p.schedule(context(), CANDIDATES, random.Random(0))


@pytest.mark.parametrize(
    ("raw", "clamped"),
    [(-1.0, 0.0), (2.5, 1.0), (math.nan, 0.0), (0.25, 0.25), (math.inf, 1.0), (-math.inf, 0.0)],
)
def test_scores_are_clamped_to_unit_range(raw: float, clamped: float) -> None:
    p = profile((FixedScorer("x", {"a": raw}), 2.0))
    d = p.schedule(context(), CANDIDATES[:1], random.Random(0))
    assert d.total == {"a": 2.0 * clamped}
    assert d.scores == {"a": {"x": clamped}}


def test_explain_gives_scores_for_every_ranked_replica() -> None:
    p = profile((FixedScorer("x", {"a": 1.0}), 1.0))
    d = p.schedule(context(), CANDIDATES, random.Random(0), explain=True)
    assert d.scores == {"a": {"x": 1.0}, "b": {"x": 0.0}, "c": {"x": 0.0}}


def test_a_soft_filter_that_would_drop_everyone_is_skipped() -> None:
    p = profile(
        (FixedScorer("x", {"c": 1.0}), 1.0),
        filters=[
            DropFilter("all", frozenset("abc"), soft=True),
            DropFilter("no-a", frozenset("a"), soft=True),
        ],
    )
    d = p.schedule(context(), CANDIDATES, random.Random(0))
    assert names(d.ranked) == ["c", "b"]
    assert d.dropped == {"a": "no-a"}


def test_a_hard_filter_that_drops_everyone_leaves_nothing_to_serve() -> None:
    p = profile(
        (FixedScorer("x"), 1.0),
        filters=[DropFilter("no-a", frozenset("a")), DropFilter("none", frozenset("abc"))],
    )
    d = p.schedule(context(), CANDIDATES, random.Random(0))
    assert d.ranked == ()
    assert d.replica is None
    assert d.dropped == {"a": "no-a", "b": "none", "c": "none"}
    assert d.scores == {}
    assert d.total == {}


def test_empty_candidates() -> None:
    d = profile((FixedScorer("x"), 1.0)).schedule(context(), [], random.Random(0))
    assert d.ranked == ()


def test_no_scorers_means_all_tied() -> None:
    p = SchedulingProfile([HealthyFilter()], [], MaxScorePicker())
    d = p.schedule(context(), CANDIDATES, random.Random(3))
    assert sorted(names(d.ranked)) == ["a", "b", "c"]
    assert d.total == {"a": 0.0, "b": 0.0, "c": 0.0}


def test_ties_break_the_same_way_for_the_same_seed() -> None:
    p = profile((FixedScorer("x", {"a": 1.0, "b": 1.0, "c": 1.0}), 1.0))
    runs = [names(p.schedule(context(), CANDIDATES, random.Random(11)).ranked) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    winners = {p.schedule(context(), CANDIDATES, random.Random(s)).ranked[0].name for s in range(30)}
    assert winners == {"a", "b", "c"}


def test_a_timer_times_every_plugin() -> None:
    p = profile((FixedScorer("x"), 1.0), (FixedScorer("y"), 1.0), filters=[DropFilter("f", frozenset())])
    d = p.schedule(context(), CANDIDATES, random.Random(0), timer=StepTimer())
    assert d.plugin_seconds == {"f": 1.0, "x": 1.0, "y": 1.0, "max-score": 1.0}


@pytest.mark.parametrize(
    ("scorers", "message"),
    [
        (
            [WeightedScorer(FixedScorer("x"), 1.0), WeightedScorer(FixedScorer("x"), 1.0)],
            "duplicate plugin names in a profile: x",
        ),
        ([WeightedScorer(FixedScorer("max-score"), 1.0)], "duplicate plugin names in a profile: max-score"),
        ([WeightedScorer(FixedScorer("x"), -1.0)], "'x': weight must be finite and >= 0"),
        ([WeightedScorer(FixedScorer("x"), math.nan)], "'x': weight must be finite and >= 0"),
    ],
)
def test_refuses_bad_profiles(scorers: list[WeightedScorer], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SchedulingProfile([], scorers, MaxScorePicker())
