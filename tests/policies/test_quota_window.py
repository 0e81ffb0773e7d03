"""policies/quota_window.py: calendar windows in a time zone, table-tested at the calendar's edges
(DST changes both ways, midnights that do not exist or happen twice, month ends, leap days, ISO
weeks across a year end) with literal instants: no clock is read."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from policies.quota_window import Period, Window, iso_local, iso_utc, window_at, zone


def utc(text: str) -> float:
    """'2026-12-03T10:00:00' (UTC) -> Unix seconds."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


# (period, zone, an instant (UTC), expected start (UTC), expected end (UTC), label, hours long)
CASES: list[tuple[Period, str, str, str, str, str, float]] = [
    # plain days: UTC and an offset zone (Berlin is UTC+1 in winter: its day starts at 23:00 UTC)
    ("day", "UTC", "2026-12-03T10:00:00", "2026-12-03T00:00:00", "2026-12-04T00:00:00", "2026-12-03", 24),
    ("day", "Europe/Berlin", "2026-12-03T10:00:00", "2026-12-02T23:00:00", "2026-12-03T23:00:00",
     "2026-12-03", 24),
    # 23:30 UTC on Dec 3 is already Dec 4 in Berlin
    ("day", "Europe/Berlin", "2026-12-03T23:30:00", "2026-12-03T23:00:00", "2026-12-04T23:00:00",
     "2026-12-04", 24),
    # the boundary itself belongs to the new window; one second before to the old one
    ("day", "Europe/Berlin", "2026-12-03T23:00:00", "2026-12-03T23:00:00", "2026-12-04T23:00:00",
     "2026-12-04", 24),
    ("day", "Europe/Berlin", "2026-12-03T22:59:59", "2026-12-02T23:00:00", "2026-12-03T23:00:00",
     "2026-12-03", 24),
    # DST starts in Berlin on 2026-03-29 (02:00 -> 03:00): a 23-hour day; ends on 2026-10-25: 25 hours
    ("day", "Europe/Berlin", "2026-03-29T12:00:00", "2026-03-28T23:00:00", "2026-03-29T22:00:00",
     "2026-03-29", 23),
    ("day", "Europe/Berlin", "2026-10-25T12:00:00", "2026-10-24T22:00:00", "2026-10-25T23:00:00",
     "2026-10-25", 25),
    # inside the repeated hour (02:30 local happens twice on 2026-10-25): still that day
    ("day", "Europe/Berlin", "2026-10-25T00:30:00", "2026-10-24T22:00:00", "2026-10-25T23:00:00",
     "2026-10-25", 25),
    ("day", "Europe/Berlin", "2026-10-25T01:30:00", "2026-10-24T22:00:00", "2026-10-25T23:00:00",
     "2026-10-25", 25),
    # America/Santiago: on 2026-09-06 the clock jumps from 24:00 to 01:00, midnight does not exist;
    # the day starts at the jump (04:00 UTC = 01:00 local) and is 23 hours long
    ("day", "America/Santiago", "2026-09-06T12:00:00", "2026-09-06T04:00:00", "2026-09-07T03:00:00",
     "2026-09-06", 23),
    ("day", "America/Santiago", "2026-09-06T03:59:59", "2026-09-05T04:00:00", "2026-09-06T04:00:00",
     "2026-09-05", 24),
    # America/Havana: on 2026-11-01 the clock goes back from 01:00 to 00:00, midnight happens twice;
    # the day starts at the first one and is 25 hours long
    ("day", "America/Havana", "2026-11-01T04:30:00", "2026-11-01T04:00:00", "2026-11-02T05:00:00",
     "2026-11-01", 25),
    ("day", "America/Havana", "2026-11-01T05:30:00", "2026-11-01T04:00:00", "2026-11-02T05:00:00",
     "2026-11-01", 25),
    # Pacific/Apia skipped 2011-12-30: Dec 29 ends (at 10:00 UTC) where Dec 31 begins
    ("day", "Pacific/Apia", "2011-12-30T09:59:59", "2011-12-29T10:00:00", "2011-12-30T10:00:00",
     "2011-12-29", 24),
    ("day", "Pacific/Apia", "2011-12-30T10:00:00", "2011-12-30T10:00:00", "2011-12-31T10:00:00",
     "2011-12-31", 24),
    # a half-hour offset
    ("day", "Asia/Kolkata", "2026-01-01T00:00:00", "2025-12-31T18:30:00", "2026-01-01T18:30:00",
     "2026-01-01", 24),
    # months: ends of 31-, 30- and 28/29-day months, the year end, DST inside the month
    ("month", "UTC", "2026-01-31T23:59:59", "2026-01-01T00:00:00", "2026-02-01T00:00:00", "2026-01", 744),
    ("month", "UTC", "2026-02-15T00:00:00", "2026-02-01T00:00:00", "2026-03-01T00:00:00", "2026-02", 672),
    ("month", "UTC", "2028-02-29T12:00:00", "2028-02-01T00:00:00", "2028-03-01T00:00:00", "2028-02", 696),
    ("month", "UTC", "2026-04-30T23:59:59", "2026-04-01T00:00:00", "2026-05-01T00:00:00", "2026-04", 720),
    ("month", "UTC", "2026-12-31T23:59:59", "2026-12-01T00:00:00", "2027-01-01T00:00:00", "2026-12", 744),
    ("month", "Europe/Berlin", "2026-12-31T23:30:00", "2026-12-31T23:00:00", "2027-01-31T23:00:00",
     "2027-01", 744),
    ("month", "Europe/Berlin", "2026-03-15T00:00:00", "2026-02-28T23:00:00", "2026-03-31T22:00:00",
     "2026-03", 743),
    ("month", "Europe/Berlin", "2026-10-15T00:00:00", "2026-09-30T22:00:00", "2026-10-31T23:00:00",
     "2026-10", 745),
    # days around a leap day
    ("day", "UTC", "2028-02-29T00:00:00", "2028-02-29T00:00:00", "2028-03-01T00:00:00", "2028-02-29", 24),
    ("day", "America/New_York", "2028-03-01T04:59:59", "2028-02-29T05:00:00", "2028-03-01T05:00:00",
     "2028-02-29", 24),
    # ISO weeks: Monday to Sunday; across a year end the ISO year is the week's
    ("week", "UTC", "2026-12-03T10:00:00", "2026-11-30T00:00:00", "2026-12-07T00:00:00", "2026-W49", 168),
    ("week", "UTC", "2027-01-01T00:00:00", "2026-12-28T00:00:00", "2027-01-04T00:00:00", "2026-W53", 168),
    ("week", "UTC", "2025-12-31T00:00:00", "2025-12-29T00:00:00", "2026-01-05T00:00:00", "2026-W01", 168),
    ("week", "Europe/Berlin", "2026-10-28T00:00:00", "2026-10-25T23:00:00", "2026-11-01T23:00:00",
     "2026-W44", 168),
    ("week", "Europe/Berlin", "2026-10-22T00:00:00", "2026-10-18T22:00:00", "2026-10-25T23:00:00",
     "2026-W43", 169),
]  # fmt: skip


@pytest.mark.parametrize(("period", "tz", "now", "start", "end", "label", "hours"), CASES)
def test_window_at(period: Period, tz: str, now: str, start: str, end: str, label: str, hours: float) -> None:
    w = window_at(period, zone(tz), utc(now))
    assert w == Window(utc(start), utc(end), label)
    assert (w.end - w.start) / 3600 == hours
    assert w.contains(utc(now)) and not w.contains(w.end) and w.contains(w.start)


@pytest.mark.parametrize("period", ["day", "week", "month"])
@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin", "America/Santiago", "America/Havana", "Asia/Kolkata"])
def test_windows_tile_time_without_gaps_or_overlaps(period: Period, tz: str) -> None:
    """A year of consecutive windows: each starts where the previous ended."""
    z = zone(tz)
    w = window_at(period, z, utc("2026-01-01T12:00:00"))
    for _ in range(400 if period == "day" else 60 if period == "week" else 13):
        nxt = window_at(period, z, w.end)
        assert nxt.start == w.end and nxt.end > nxt.start and nxt.label != w.label
        assert window_at(period, z, w.end - 0.001) == w
        w = nxt


def test_reset_is_the_time_left_in_the_window() -> None:
    w = window_at("day", zone("Europe/Berlin"), utc("2026-12-03T22:00:00"))
    assert w.reset_s(utc("2026-12-03T22:00:00")) == 3600
    assert w.reset_s(w.end + 5) == 0


def test_unknown_zone_is_named() -> None:
    for bad in ("Mars/Olympus", "", "../etc/passwd", "Europe/Berlin ", "Europe", "/etc/passwd", "UTC\x00"):
        with pytest.raises(ValueError, match="unknown time zone"):
            zone(bad)


def test_iso_text() -> None:
    t = utc("2026-12-31T23:00:00")
    assert iso_utc(t) == "2026-12-31T23:00:00Z"
    assert iso_local(t, zone("Europe/Berlin")) == "2027-01-01T00:00:00+01:00"
