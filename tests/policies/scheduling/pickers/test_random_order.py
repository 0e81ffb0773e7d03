import random

from policies.scheduling.pickers.random_order import RandomPicker
from tests.policies.scheduling.builders import context, names, replica

CANDIDATES = [replica("a"), replica("b"), replica("c")]


def test_a_permutation_that_ignores_totals_and_follows_the_seed() -> None:
    totals = [9.0, 0.0, 0.0]
    orders = [names(RandomPicker().pick(context(), CANDIDATES, totals, random.Random(s))) for s in range(30)]
    assert all(sorted(o) == ["a", "b", "c"] for o in orders)
    assert {o[0] for o in orders} == {"a", "b", "c"}
    assert names(RandomPicker().pick(context(), CANDIDATES, totals, random.Random(7))) == orders[7]
