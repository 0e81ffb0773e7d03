import random

import pytest

from policies.scheduling.pickers.max_score import MaxScorePicker
from tests.policies.scheduling.builders import context, names, replica

CANDIDATES = [replica("a"), replica("b"), replica("c"), replica("d")]


@pytest.mark.parametrize(
    ("totals", "expected"),
    [
        ([0.1, 0.9, 0.5, 0.3], ["b", "c", "d", "a"]),
        ([3.0, 2.0, 1.0, 0.0], ["a", "b", "c", "d"]),
    ],
)
def test_orders_all_by_descending_total(totals: list[float], expected: list[str]) -> None:
    assert names(MaxScorePicker().pick(context(), CANDIDATES, totals, random.Random(0))) == expected


def test_ties_are_broken_by_the_rng_and_reproducibly() -> None:
    totals = [1.0, 1.0, 1.0, 0.0]
    orders = {
        tuple(names(MaxScorePicker().pick(context(), CANDIDATES, totals, random.Random(s))))
        for s in range(40)
    }
    assert {o[-1] for o in orders} == {"d"}  # the lower total always comes last
    assert {o[0] for o in orders} == {"a", "b", "c"}  # every tied replica wins for some seed
    for seed in range(5):
        first = MaxScorePicker().pick(context(), CANDIDATES, totals, random.Random(seed))
        again = MaxScorePicker().pick(context(), CANDIDATES, totals, random.Random(seed))
        assert names(first) == names(again)


def test_single_and_empty() -> None:
    assert names(MaxScorePicker().pick(context(), CANDIDATES[:1], [0.0], random.Random(0))) == ["a"]
    assert MaxScorePicker().pick(context(), [], [], random.Random(0)) == []
