import pytest

from policies.scheduling.filters.load_guard import LoadGuardFilter
from tests.policies.scheduling.builders import context, names, replica


@pytest.mark.parametrize(
    ("loads", "abs_slack", "rel_slack", "kept"),
    [
        # (waiting, in_flight) per replica a, b, c
        ([(0, 0), (0, 8), (0, 9)], 8.0, 0.5, ["a", "b"]),  # min 0: limit 0 + max(8, 0) = 8
        ([(10, 10), (0, 30), (5, 31)], 8.0, 0.5, ["a", "b"]),  # min 20: limit 20 + max(8, 10) = 30
        ([(3, 3), (3, 3), (3, 3)], 0.0, 0.0, ["a", "b", "c"]),  # equal loads all pass
        ([(0, 1), (0, 2), (0, 100)], 1.0, 0.0, ["a", "b"]),
        ([(50, 0), (0, 0), (0, 0)], 8.0, 0.5, ["b", "c"]),  # the scraped queue counts as load
    ],
)
def test_drops_replicas_far_above_the_least_loaded(
    loads: list[tuple[int, int]], abs_slack: float, rel_slack: float, kept: list[str]
) -> None:
    candidates = [replica(n, waiting=w, in_flight=f) for n, (w, f) in zip("abc", loads, strict=True)]
    guard = LoadGuardFilter(abs_slack=abs_slack, rel_slack=rel_slack)
    assert names(guard.filter(context(), candidates)) == kept


def test_single_candidate_and_empty_pass_through() -> None:
    only = [replica("a", waiting=1000)]
    assert names(LoadGuardFilter().filter(context(), only)) == ["a"]
    assert list(LoadGuardFilter().filter(context(), [])) == []


@pytest.mark.parametrize(("abs_slack", "rel_slack"), [(-1.0, 0.5), (8.0, -0.1)])
def test_refuses_negative_slack(abs_slack: float, rel_slack: float) -> None:
    with pytest.raises(ValueError, match="slack"):
        LoadGuardFilter(abs_slack=abs_slack, rel_slack=rel_slack)


def test_is_soft() -> None:
    assert LoadGuardFilter.soft is True
