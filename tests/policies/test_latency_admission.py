"""policies/latency_admission.py: the knee, the order SLOs tighten it, the header that may only
tighten, the room a replica has, and the Retry-After from the predicted drain."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.fair_share import FairShare
from policies.latency_admission import (
    NO_SLO,
    LatencySlo,
    excess_s,
    knee_bound_s,
    parse_ttft_slo_header,
    replica_room,
    retry_after_from_drain,
    ttft_bound_s,
)


def test_without_an_slo_the_bound_is_the_knee_factor_times_the_unloaded_ttft() -> None:
    assert ttft_bound_s(0.1, 2.0, None) == pytest.approx(0.2)
    assert ttft_bound_s(0.1, 3.0, None) == pytest.approx(0.3)


def test_an_slo_only_tightens_and_never_below_the_unloaded_ttft() -> None:
    assert ttft_bound_s(0.1, 2.0, 0.15) == pytest.approx(0.15)  # tighter than the knee: it wins
    assert ttft_bound_s(0.1, 2.0, 5.0) == pytest.approx(0.2)  # looser: the knee stays
    # Unmeetable anywhere: the request may still go, but only where nothing is ahead of it.
    assert ttft_bound_s(0.1, 2.0, 0.01) == pytest.approx(0.1)


def test_slos_combine_to_the_tightest_of_each_kind_in_any_order() -> None:
    band = LatencySlo(ttft_s=0.5, tpot_s=0.05)
    tenant = LatencySlo(ttft_s=0.3)
    header = LatencySlo(ttft_s=0.8)  # looser than the band and the tenant: no effect
    for combined in (
        band.tighten(tenant).tighten(header),
        header.tighten(tenant).tighten(band),
        tenant.tighten(header).tighten(band),
    ):
        assert combined == LatencySlo(ttft_s=0.3, tpot_s=0.05)
    assert NO_SLO.tighten(NO_SLO) == NO_SLO
    assert NO_SLO.tighten(LatencySlo(ttft_s=0.2)) == LatencySlo(ttft_s=0.2)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_an_slo_must_be_finite_and_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="finite and > 0"):
        LatencySlo(ttft_s=bad)


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        (None, None),
        (b"250", 0.25),
        (b"80.5", 0.0805),
        (b" 1000 ", 1.0),
        (b"3600000", 3600.0),
        (b"0.5", 0.0005),
    ],
)
def test_the_header_in_milliseconds(raw: bytes | None, seconds: float | None) -> None:
    got = parse_ttft_slo_header(raw)
    assert got == (None if seconds is None else pytest.approx(seconds))


@pytest.mark.parametrize(
    "raw",
    [b"", b" ", b"abc", b"-5", b"+5", b"0", b"0.0", b"1e3", b"nan", b"inf", b"1.2.3", b".", b"3600001",
     b"99999999999999999999", b"\xff\xfe", b"250ms", b"2,5"],
)  # fmt: skip
def test_a_malformed_header_is_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_ttft_slo_header(raw)


@given(st.binary(max_size=40))
def test_nothing_in_the_header_raises_anything_but_value_error(raw: bytes) -> None:
    try:
        got = parse_ttft_slo_header(raw)
    except ValueError:
        return
    assert got is not None and 0 < got <= 3600.0


def test_room_is_zero_over_the_bound_and_counts_what_fits_in_the_slack() -> None:
    # unloaded 0.1 s, knee 2: bound 0.2 s; each like request adds 0.05 s of prefill.
    assert replica_room(0.21, 0.1, 0.05, 2.0, NO_SLO) == 0
    assert replica_room(0.2, 0.1, 0.05, 2.0, NO_SLO) == 1  # exactly at the bound: this one fits
    assert replica_room(0.1, 0.1, 0.05, 2.0, NO_SLO) == 3  # idle: itself and two more
    assert replica_room(math.nan, 0.1, 0.05, 2.0, NO_SLO) == 0
    assert replica_room(0.1, 0.1, 0.0, 2.0, NO_SLO) > 1000  # a fully cached request costs no prefill


def test_a_tighter_ttft_slo_shrinks_the_room_and_a_tpot_slo_closes_a_slow_replica() -> None:
    assert replica_room(0.12, 0.1, 0.05, 3.0, NO_SLO) == 4
    assert replica_room(0.12, 0.1, 0.05, 3.0, LatencySlo(ttft_s=0.15)) == 1
    assert replica_room(0.16, 0.1, 0.05, 3.0, LatencySlo(ttft_s=0.15)) == 0
    slow = LatencySlo(tpot_s=0.02)
    assert replica_room(0.1, 0.1, 0.05, 2.0, slow, tpot_s=0.03) == 0
    assert replica_room(0.1, 0.1, 0.05, 2.0, slow, tpot_s=0.01) == 3


def test_the_knee_allows_at_least_a_decode_step_on_a_busy_replica() -> None:
    # A short prompt: 6 ms unloaded, a 5 ms decode step running there. 1.25 x 6 ms leaves 1.5 ms of
    # slack, less than the step under way that any request sent there waits for: the knee is 11 ms.
    assert knee_bound_s(0.006, 1.25, 0.005) == pytest.approx(0.011)
    assert knee_bound_s(0.006, 1.25) == pytest.approx(0.0075)  # nothing runs there: no step
    # A long prompt: 30 ms unloaded, 7.5 ms of slack at 1.25 is more than the step: unchanged.
    assert knee_bound_s(0.030, 1.25, 0.005) == pytest.approx(0.0375)
    # The gate's bound, its room and its drain count the step the same way.
    assert ttft_bound_s(0.006, 1.25, None, 0.005) == pytest.approx(0.011)
    assert replica_room(0.010, 0.006, 0.006, 1.25, NO_SLO) == 0  # mid-step, without the allowance
    assert replica_room(0.010, 0.006, 0.006, 1.25, NO_SLO, step_s=0.005) == 1
    assert excess_s(0.013, 0.006, 1.25, NO_SLO, 0.005) == pytest.approx(0.002)
    # An SLO still caps it (never below unloaded): the allowance loosens the knee, not an SLO.
    assert ttft_bound_s(0.006, 1.25, 0.008, 0.005) == pytest.approx(0.008)
    assert ttft_bound_s(0.006, 1.25, 0.004, 0.005) == pytest.approx(0.006)


def test_retry_after_is_the_predicted_drain_rounded_up() -> None:
    assert excess_s(2.7, 0.1, 2.0, NO_SLO) == pytest.approx(2.5)
    assert excess_s(0.15, 0.1, 2.0, NO_SLO) == 0.0
    assert retry_after_from_drain(2.5, fallback_s=5) == 3
    assert retry_after_from_drain(0.0, fallback_s=5) == 1  # never 0: no immediate retry storm
    assert retry_after_from_drain(math.inf, fallback_s=5) == 5  # no replica: the fallback
    assert retry_after_from_drain(1e9, fallback_s=5) == 60  # capped


def test_outweighed_only_when_another_tenant_is_above_its_share() -> None:
    share = FairShare(window_s=10.0)
    for _ in range(3):
        share.started("heavy", 1.0, 0.0)
    none_queued = lambda _t: 0  # noqa: E731
    alone = share.outweighed(0, 1.0, none_queued)
    assert not alone("heavy")  # a tenant alone is held by the gate like any load
    share.seen("light", 1.0, 1.0)
    light = share.outweighed(0, 1.0, none_queued)
    assert light("light") and not light("heavy")
    assert light("never-seen")  # holds nothing: below its share
    share.started("light", 1.0, 1.0)
    share.started("light", 1.0, 1.0)
    share.started("light", 1.0, 1.0)  # 3 and 3: nobody above the other
    even = share.outweighed(0, 1.0, none_queued)
    assert not even("light") and not even("heavy")
