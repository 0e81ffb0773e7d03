from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.ratelimit_headers import format_duration, limit_headers, ratelimit_headers


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-5, "0s"),
        (0.0001, "1ms"),  # rounded up: never a reset that is too soon
        (0.001, "1ms"),  # ...but float noise does not add a millisecond
        (0.12, "120ms"),
        (0.999, "999ms"),
        (0.9991, "1s"),
        (1, "1s"),
        (1.5, "1.5s"),
        (8.64, "8.64s"),
        (59, "59s"),
        (60, "1m0s"),
        (252.172, "4m12.172s"),
        (360, "6m0s"),
        (3600, "1h0m0s"),
        (3723, "1h2m3s"),
        (83909.144, "23h18m29.144s"),
        (90000, "25h0m0s"),  # no day unit, like Go
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_format_duration_refuses_non_finite(bad: float) -> None:
    with pytest.raises(ValueError):
        format_duration(bad)


GO_DURATION = re.compile(r"^(0s|[1-9]\d{0,2}ms|(?:(\d+)h)?(?:(\d+)m)?(\d+)(?:\.(\d{1,3}))?s)$")


@given(st.integers(min_value=0, max_value=10**10))
def test_format_duration_round_trips_whole_milliseconds(ms: int) -> None:
    text = format_duration(ms / 1000)
    m = GO_DURATION.match(text)
    assert m is not None, text
    if text.endswith("ms"):
        assert int(text[:-2]) == ms
    elif text != "0s":
        hours, minutes, secs, frac = (m.group(i) for i in (2, 3, 4, 5))
        total = int(hours or 0) * 3_600_000 + int(minutes or 0) * 60_000 + int(secs) * 1000
        total += int((frac or "0").ljust(3, "0"))
        assert total == ms
        assert ms >= 1000
        assert int(secs) < 60 and (hours is None or int(minutes) < 60)
    else:
        assert ms == 0


def test_ratelimit_headers_as_openai_sends_them() -> None:
    assert ratelimit_headers(
        req_limit=60,
        req_remaining=59,
        req_reset_s=1,
        tok_limit=150_000,
        tok_remaining=149_984.7,
        tok_reset_s=360,
    ) == [
        (b"x-ratelimit-limit-requests", b"60"),
        (b"x-ratelimit-remaining-requests", b"59"),
        (b"x-ratelimit-reset-requests", b"1s"),
        (b"x-ratelimit-limit-tokens", b"150000"),
        (b"x-ratelimit-remaining-tokens", b"149984"),  # floored: never promise a fraction
        (b"x-ratelimit-reset-tokens", b"6m0s"),
    ]


@pytest.mark.parametrize(
    ("limit", "remaining", "reset_s", "expected"),
    [
        (600, -250.0, 85.0, [b"600", b"0", b"1m25s"]),  # in debt: 0 remaining, reset includes the debt
        (66_666.67, 0.4, 0.0, [b"66666", b"0", b"0s"]),  # a fractional share of a limit
        (10, math.nan, 0.12, [b"10", b"0", b"120ms"]),
    ],
)
def test_limit_headers_for_one_bucket(
    limit: float, remaining: float, reset_s: float, expected: list[bytes]
) -> None:
    got = limit_headers("tokens", limit, remaining, reset_s)
    assert [name for name, _ in got] == [
        b"x-ratelimit-limit-tokens",
        b"x-ratelimit-remaining-tokens",
        b"x-ratelimit-reset-tokens",
    ]
    assert [value for _, value in got] == expected
