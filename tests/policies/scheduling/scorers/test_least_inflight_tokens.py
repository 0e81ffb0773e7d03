from policies.scheduling.scorers.least_inflight_tokens import LeastInflightTokensScorer
from tests.policies.scheduling.builders import context, replica


def test_fewer_tokens_in_flight_is_better() -> None:
    candidates = [
        replica("a", in_flight=1, in_flight_tokens=30_000),
        replica("b", in_flight=10, in_flight_tokens=1_000),
        replica("c", in_flight=5, in_flight_tokens=15_500),
    ]
    assert list(LeastInflightTokensScorer().score(context(), candidates)) == [0.0, 1.0, 0.5]


def test_equal_tokens_score_one() -> None:
    candidates = [replica("a"), replica("b")]
    assert list(LeastInflightTokensScorer().score(context(), candidates)) == [1.0, 1.0]
