import pytest

from policies.scheduling.filters.kv_full import KvFullFilter
from tests.policies.scheduling.builders import context, names, replica


@pytest.mark.parametrize(
    ("threshold", "kept"),
    [
        (0.98, ["empty", "busy"]),
        (0.9, ["empty"]),
        (1.0, ["empty", "busy", "full"]),
    ],
)
def test_drops_at_or_above_threshold(threshold: float, kept: list[str]) -> None:
    candidates = [
        replica("empty", kv_usage=0.0),
        replica("busy", kv_usage=0.95),
        replica("full", kv_usage=0.98),
    ]
    assert names(KvFullFilter(threshold=threshold).filter(context(), candidates)) == kept


@pytest.mark.parametrize("threshold", [0.0, -0.1, 1.5])
def test_refuses_a_threshold_outside_0_1(threshold: float) -> None:
    with pytest.raises(ValueError, match="threshold"):
        KvFullFilter(threshold=threshold)


def test_is_soft() -> None:
    assert KvFullFilter.soft is True
