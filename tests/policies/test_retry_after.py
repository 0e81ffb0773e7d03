from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.retry_after import retry_after_from_bucket, retry_after_from_queue
from policies.token_bucket import BucketSpec, BucketState, take


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0.0, 1),  # never 0: that invites an immediate retry storm
        (0.001, 1),
        (1.0, 1),
        (1.0001, 2),  # rounded up: waiting the advertised time is enough
        (2.0000000000004, 2),  # float noise is not a whole extra second
        (59.5, 60),
        (-3.0, 1),
        (7200.0, 3600),  # capped
        (math.inf, 3600),  # too large for the limit (better: no Retry-After at all)
        (math.nan, 3600),
    ],
)
def test_retry_after_from_bucket(seconds: float, expected: int) -> None:
    assert retry_after_from_bucket(seconds) == expected


def test_retry_after_from_bucket_custom_cap() -> None:
    assert retry_after_from_bucket(100.0, cap_s=30) == 30
    with pytest.raises(ValueError):
        retry_after_from_bucket(1.0, cap_s=0)


def test_retry_after_from_a_real_refusal() -> None:
    spec = BucketSpec.per_minute(6000)  # 100 tokens/s
    r = take(spec, BucketState(50, 0), 400, now=0)
    assert not r.allowed
    assert retry_after_from_bucket(r.retry_after_s) == 4  # 350 missing tokens at 100/s = 3.5 s


@pytest.mark.parametrize(
    ("ahead", "rate", "kwargs", "expected"),
    [
        (100, 10.0, {}, 10),  # 100 requests ahead at 10/s
        (100, 30.0, {}, 4),  # 3.33 s, rounded up
        (50_000, 2_500.0, {}, 20),  # tokens ahead at tokens/s
        (0, 10.0, {}, 1),  # nothing ahead: floor
        (1, 1000.0, {"floor_s": 2}, 2),
        (10_000, 1.0, {}, 60),  # default cap
        (10_000, 1.0, {"cap_s": 300}, 300),
        (100, 0.0, {}, 5),  # rate unknown: fallback
        (100, -1.0, {}, 5),
        (100, math.nan, {}, 5),
        (100, math.inf, {}, 5),
        (math.nan, 10.0, {}, 5),
        (100, 0.0, {"fallback_s": 500}, 60),  # the fallback is clamped too
        (-10, 10.0, {}, 1),
    ],
)
def test_retry_after_from_queue(ahead: float, rate: float, kwargs: dict[str, int], expected: int) -> None:
    params = {"fallback_s": 5} | kwargs
    assert retry_after_from_queue(ahead, rate, **params) == expected


@pytest.mark.parametrize(("floor_s", "cap_s"), [(0, 10), (5, 4)])
def test_retry_after_from_queue_refuses_bad_bounds(floor_s: int, cap_s: int) -> None:
    with pytest.raises(ValueError):
        retry_after_from_queue(1, 1.0, fallback_s=1, floor_s=floor_s, cap_s=cap_s)


@given(st.floats(min_value=0, max_value=1e7), st.floats(min_value=1e-3, max_value=1e6))
def test_queue_estimate_covers_the_drain_time_within_bounds(ahead: float, rate: float) -> None:
    got = retry_after_from_queue(ahead, rate, fallback_s=5, floor_s=1, cap_s=120)
    assert 1 <= got <= 120
    if got < 120:
        assert got * rate >= ahead - 1e-6 * max(1.0, ahead)
