import pytest

from policies.scheduling.scorers.kv_headroom import KvHeadroomScorer
from tests.policies.scheduling.builders import context, replica


@pytest.mark.parametrize(
    ("usage", "expected"),
    [(0.0, 1.0), (0.25, 0.75), (1.0, 0.0)],
)
def test_one_minus_usage(usage: float, expected: float) -> None:
    assert list(KvHeadroomScorer().score(context(), [replica("a", kv_usage=usage)])) == [expected]
