"""Calendar windows for quotas: the day, ISO week or month that holds an instant, in a time zone.

A quota counts within one window at a time. A window runs from local midnight of its first day to
local midnight of the day after its last one, in the quota's time zone, half-open: `[start, end)`.
Instants are Unix seconds (UTC, floats); nothing here reads a clock, the caller passes `now`.

Where the local clock jumps, the window follows the calendar, not a fixed length:

- across a DST change a day is 23 or 25 hours long (both ends are local midnights), a month one hour
  shorter or longer;
- where local midnight does not exist (the clock jumps from 23:59:59 to 01:00, as in
  America/Santiago in September; Pacific/Apia skipped 2011-12-30 entirely), the day starts at the
  first instant that exists after it: PEP 495's `fold=0` reads a time in a gap with the offset from
  before the jump, which is exactly the instant of the jump;
- where midnight happens twice (the clock goes back from 01:00 to 00:00, as in America/Havana in
  November), the day starts at the first one (`fold=0` is the earlier instant).

Weeks are ISO weeks, Monday to Sunday. Months are calendar months (28 to 31 days, February 29 in
leap years). Window labels are the local calendar's names: `2026-12-03`, `2026-W49`, `2026-12`.

Cost: `window_at` builds three datetimes (~3 us); callers keep the window and ask again only once
`now` has left it (`Window.contains`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

Period = Literal["day", "week", "month"]
PERIODS: tuple[Period, ...] = get_args(Period)


@dataclass(frozen=True, slots=True)
class Window:
    """One calendar window: `[start, end)` in Unix seconds, named by `label` in local time."""

    start: float
    end: float
    label: str

    def contains(self, t: float) -> bool:
        return self.start <= t < self.end

    def reset_s(self, now: float) -> float:
        """Seconds from `now` until the window ends (0 once it has)."""
        return max(0.0, self.end - now)


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name` (e.g. "Europe/Berlin", "UTC"); ValueError naming it if unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a directory such as "Europe"
        raise ValueError(
            f"unknown time zone {name!r} (expected an IANA name such as 'Europe/Berlin')"
        ) from None


def local_midnight(day: date, tz: tzinfo) -> float:
    """The first instant of `day` in `tz` (see the module docstring for days without a midnight)."""
    return datetime(day.year, day.month, day.day, tzinfo=tz).timestamp()


def first_day(period: Period, day: date) -> date:
    """The first calendar day of the `period` window that holds `day`."""
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    raise ValueError(f"unknown period {period!r}; expected one of {', '.join(PERIODS)}")


def next_first_day(period: Period, first: date) -> date:
    """The first day of the window after the one starting on `first`."""
    if period == "day":
        return first + timedelta(days=1)
    if period == "week":
        return first + timedelta(days=7)
    if first.month == 12:
        return date(first.year + 1, 1, 1)
    return date(first.year, first.month + 1, 1)


def label_of(period: Period, first: date) -> str:
    if period == "day":
        return first.isoformat()
    if period == "week":
        year, week, _ = first.isocalendar()
        return f"{year}-W{week:02d}"
    return f"{first.year}-{first.month:02d}"


def window_at(period: Period, tz: tzinfo, now: float) -> Window:
    """The `period` window in `tz` that holds the instant `now` (Unix seconds)."""
    today = datetime.fromtimestamp(now, tz).date()
    first = first_day(period, today)
    return Window(
        start=local_midnight(first, tz),
        end=local_midnight(next_first_day(period, first), tz),
        label=label_of(period, first),
    )


def iso_local(t: float, tz: tzinfo) -> str:
    """`t` as RFC 3339 text in `tz`, to the second (e.g. for a reset time in a message)."""
    return datetime.fromtimestamp(t, tz).isoformat(timespec="seconds")


def iso_utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
