import pytest

from policies.scheduling.filters.fresh import FreshFilter
from tests.policies.scheduling.builders import NOW, context, names, replica


@pytest.mark.parametrize(
    ("scraped_at", "stale_after_s", "fresh"),
    [
        (NOW, 1.0, True),
        (NOW - 0.5, 1.0, True),
        (NOW - 1.0, 1.0, True),  # exactly at the limit still counts, as ReplicaState.is_fresh says
        (NOW - 1.5, 1.0, False),
        (NOW - 1.5, 2.0, True),
        (None, 1.0, False),  # never scraped
    ],
)
def test_fresh_by_scrape_age(scraped_at: float | None, stale_after_s: float, fresh: bool) -> None:
    candidates = [replica("a", scraped_at=scraped_at)]
    kept = FreshFilter().filter(context(stale_after_s=stale_after_s), candidates)
    assert names(kept) == (["a"] if fresh else [])
    assert candidates[0].is_fresh(NOW, stale_after_s) is fresh


def test_keeps_order_and_is_soft() -> None:
    candidates = [replica("a"), replica("b", scraped_at=NOW - 9), replica("c")]
    assert names(FreshFilter().filter(context(), candidates)) == ["a", "c"]
    assert FreshFilter.soft is True
