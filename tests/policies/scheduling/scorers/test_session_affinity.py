import pytest

from policies.scheduling.scorers.session_affinity import SessionAffinityScorer
from tests.policies.scheduling.builders import context, replica


@pytest.mark.parametrize(
    ("session_replica", "expected"),
    [("b", [0.0, 1.0]), (None, [0.0, 0.0]), ("gone", [0.0, 0.0])],
)
def test_one_for_the_session_replica(session_replica: str | None, expected: list[float]) -> None:
    candidates = [replica("a"), replica("b")]
    assert (
        list(SessionAffinityScorer().score(context(session_replica=session_replica), candidates)) == expected
    )
