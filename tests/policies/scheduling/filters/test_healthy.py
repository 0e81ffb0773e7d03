import pytest

from policies.scheduling.filters.healthy import HealthyFilter
from tests.policies.scheduling.builders import context, names, replica


@pytest.mark.parametrize(
    ("health", "kept"),
    [
        ({"a": True, "b": True}, ["a", "b"]),
        ({"a": False, "b": True}, ["b"]),
        ({"a": False, "b": False}, []),
    ],
)
def test_keeps_only_healthy(health: dict[str, bool], kept: list[str]) -> None:
    candidates = [replica(n, healthy=h) for n, h in health.items()]
    assert names(HealthyFilter().filter(context(), candidates)) == kept


def test_is_hard() -> None:
    assert HealthyFilter.soft is False
