from __future__ import annotations

import math

import pytest

from policies.drain_rate import DrainRate, DrainRates


def steady(d: DrainRate, start: float, seconds: float, per_s: int, tokens_each: int = 0) -> float:
    """Feed `per_s` completions per second, evenly spaced, for `seconds`; returns the end time."""
    n = int(seconds * per_s)
    for k in range(1, n + 1):
        d.observe(start + k / per_s, requests=1, tokens=tokens_each)
    return start + n / per_s


def test_nothing_observed_is_exactly_zero() -> None:
    d = DrainRate(now=50.0)
    assert d.rates(50.0) == DrainRates(0.0, 0.0)
    assert d.rates(1e6) == DrainRates(0.0, 0.0)


def test_one_early_completion_is_not_read_as_a_huge_rate() -> None:
    d = DrainRate(now=0.0, time_constant_s=10.0, min_window_s=1.0)
    d.observe(0.001)
    assert d.requests_per_s(0.001) == pytest.approx(1.0, rel=1e-3)  # one per min_window_s


@pytest.mark.parametrize(
    ("per_s", "seconds"),
    [
        (10, 100.0),  # long run: the estimate settles on the rate
        (10, 3.0),  # shortly after start: no dilution by time before the estimator existed
        (200, 30.0),
        (1, 50.0),
    ],
)
def test_steady_rate_is_recovered(per_s: int, seconds: float) -> None:
    d = DrainRate(now=0.0, time_constant_s=10.0)
    end = steady(d, 0.0, seconds, per_s, tokens_each=300)
    rates = d.rates(end)
    assert rates.requests_per_s == pytest.approx(per_s, rel=0.06)
    assert rates.tokens_per_s == pytest.approx(per_s * 300, rel=0.06)


def test_rate_follows_a_change_within_a_few_time_constants() -> None:
    d = DrainRate(now=0.0, time_constant_s=5.0)
    t = steady(d, 0.0, 60.0, 100)
    t = steady(d, t, 25.0, 10)  # five time constants later
    assert d.requests_per_s(t) == pytest.approx(10, rel=0.1)


@pytest.mark.parametrize(("idle_s", "factor"), [(0.0, 1.0), (10.0, math.exp(-1)), (30.0, math.exp(-3))])
def test_idle_decays_exponentially(idle_s: float, factor: float) -> None:
    d = DrainRate(now=0.0, time_constant_s=10.0)
    end = steady(d, 0.0, 200.0, 10)
    busy = d.requests_per_s(end)
    assert d.requests_per_s(end + idle_s) == pytest.approx(busy * factor, rel=1e-6)


def test_reading_does_not_change_the_estimate() -> None:
    d = DrainRate(now=0.0)
    steady(d, 0.0, 5.0, 10)
    assert d.rates(20.0) == d.rates(20.0)
    d.rates(1000.0)
    assert d.rates(20.0).requests_per_s > 0.1


def test_clock_going_backwards_decays_nothing_and_stays_finite() -> None:
    d = DrainRate(now=10.0)
    d.observe(12.0, requests=3)
    before = d.requests_per_s(12.0)
    d.observe(11.0, requests=1)  # an earlier timestamp: counted, nothing decayed
    assert d.requests_per_s(11.0) > before
    assert math.isfinite(d.requests_per_s(5.0))


@pytest.mark.parametrize(
    "kwargs",
    [{"time_constant_s": 0.0}, {"time_constant_s": math.inf}, {"min_window_s": 0.0},
     {"time_constant_s": 1.0, "min_window_s": 2.0}],
)
def test_refuses_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        DrainRate(0.0, **kwargs)


def test_refuses_negative_completions() -> None:
    with pytest.raises(ValueError):
        DrainRate(0.0).observe(1.0, requests=-1)
