import pytest

from policies.scheduling.scorers.min_max import inverted_min_max


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([0, 5, 10], [1.0, 0.5, 0.0]),
        ([4, 4, 4], [1.0, 1.0, 1.0]),
        ([7], [1.0]),
        ([], []),
        ([2, 1], [0.0, 1.0]),
    ],
)
def test_least_is_one_most_is_zero(values: list[int], expected: list[float]) -> None:
    assert inverted_min_max(values) == expected
