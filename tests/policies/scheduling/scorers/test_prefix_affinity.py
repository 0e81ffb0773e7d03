import pytest

from policies.scheduling.scorers.prefix_affinity import PrefixAffinityScorer
from tests.policies.scheduling.builders import context, replica


@pytest.mark.parametrize(
    ("match", "blocks", "expected"),
    [
        ({"a": 8, "b": 4}, 8, [1.0, 0.5, 0.0]),
        ({"a": 1}, 4, [0.25, 0.0, 0.0]),
        ({}, 8, [0.0, 0.0, 0.0]),
        ({"a": 3}, 0, [0.0, 0.0, 0.0]),  # a prompt shorter than one block
    ],
)
def test_share_of_leading_blocks(match: dict[str, int], blocks: int, expected: list[float]) -> None:
    candidates = [replica("a"), replica("b"), replica("c")]
    ctx = context(prefix_match=match, prefix_blocks=blocks)
    assert list(PrefixAffinityScorer().score(ctx, candidates)) == expected
