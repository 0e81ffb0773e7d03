import pytest

from policies.scheduling.scorers.queue_depth import QueueDepthScorer
from tests.policies.scheduling.builders import context, replica


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        # (waiting, in_flight) for a, b, c
        ([(0, 0), (2, 3), (10, 0)], [1.0, 0.5, 0.0]),
        ([(1, 1), (0, 2), (2, 0)], [1.0, 1.0, 1.0]),  # equal loads: nobody is worse
        ([(0, 4), (0, 0), (0, 8)], [0.5, 1.0, 0.0]),
    ],
)
def test_min_max_normalized_waiting_plus_in_flight(
    loads: list[tuple[int, int]], expected: list[float]
) -> None:
    candidates = [replica(n, waiting=w, in_flight=f) for n, (w, f) in zip("abc", loads, strict=True)]
    assert list(QueueDepthScorer().score(context(), candidates)) == expected


def test_running_alone_does_not_count() -> None:
    candidates = [replica("a", running=50), replica("b", running=0)]
    assert list(QueueDepthScorer().score(context(), candidates)) == [1.0, 1.0]
