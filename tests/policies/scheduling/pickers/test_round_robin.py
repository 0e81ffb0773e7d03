import random

import pytest

from policies.scheduling.pickers.round_robin import RoundRobinPicker
from tests.policies.scheduling.builders import context, names, replica

CANDIDATES = [replica("a"), replica("b"), replica("c")]


@pytest.mark.parametrize(
    ("sequence", "expected"),
    [
        (0, ["a", "b", "c"]),
        (1, ["b", "c", "a"]),
        (2, ["c", "a", "b"]),
        (3, ["a", "b", "c"]),
        (3 * 10**12 + 1, ["b", "c", "a"]),
    ],
)
def test_rotates_by_sequence(sequence: int, expected: list[str]) -> None:
    ranked = RoundRobinPicker().pick(
        context(sequence=sequence), CANDIDATES, [5.0, 0.0, 0.0], random.Random(0)
    )
    assert names(ranked) == expected


def test_empty() -> None:
    assert RoundRobinPicker().pick(context(), [], [], random.Random(0)) == []
