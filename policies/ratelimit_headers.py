"""OpenAI's `x-ratelimit-*` response headers, ready for ASGI (`list[tuple[bytes, bytes]]`).

    x-ratelimit-limit-requests      capacity of the requests bucket (whole requests)
    x-ratelimit-remaining-requests  requests left now (whole, >= 0)
    x-ratelimit-reset-requests      time until the bucket is full again, e.g. "1s", "6m0s", "120ms"
    (and the same three for -tokens)

Durations are written the way OpenAI writes them, which is Go's `time.Duration` format at millisecond
resolution: under a second as whole milliseconds ("120ms"), otherwise hours, minutes and seconds with
the larger units only when non-zero and up to three decimals of a second ("1s", "6m0s", "4m12.172s",
"1h0m0s"). Values are rounded UP to the millisecond, so a client never reads a reset that is too soon.
Per request: a few integer operations, no allocation beyond the strings.
"""

from __future__ import annotations

import math
from typing import Literal

Kind = Literal["requests", "tokens"]

_NAMES: dict[Kind, tuple[bytes, bytes, bytes]] = {
    kind: (
        f"x-ratelimit-limit-{kind}".encode(),
        f"x-ratelimit-remaining-{kind}".encode(),
        f"x-ratelimit-reset-{kind}".encode(),
    )
    for kind in ("requests", "tokens")
}

_MS_PER_HOUR = 3_600_000
_MS_PER_MINUTE = 60_000
# 0.001 * 1000 and friends must not round up to the next millisecond through float noise.
_ROUNDING_SLACK_MS = 1e-6


def format_duration(seconds: float) -> str:
    """`seconds` (finite; negative counts as 0) as OpenAI/Go duration text, rounded up to the ms."""
    if not math.isfinite(seconds):
        raise ValueError(f"duration must be finite, got {seconds!r}")
    ms = math.ceil(seconds * 1000 - _ROUNDING_SLACK_MS)
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, _MS_PER_HOUR)
    minutes, rest = divmod(rest, _MS_PER_MINUTE)
    secs, frac = divmod(rest, 1000)
    sec_text = f"{secs}.{frac:03d}".rstrip("0") if frac else str(secs)
    if hours:
        return f"{hours}h{minutes}m{sec_text}s"
    if minutes:
        return f"{minutes}m{sec_text}s"
    return f"{sec_text}s"


def _whole(n: float) -> bytes:
    """A count as header text: floored, never negative (a bucket in debt shows 0 remaining)."""
    return str(max(0, math.floor(n))).encode() if math.isfinite(n) else b"0"


def limit_headers(kind: Kind, limit: float, remaining: float, reset_s: float) -> list[tuple[bytes, bytes]]:
    """The three headers for one bucket (`kind` = "requests" or "tokens"). `limit` is the bucket's
    capacity, `remaining` its level now, `reset_s` seconds until full (`TakeResult.reset_s`)."""
    name_limit, name_remaining, name_reset = _NAMES[kind]
    return [
        (name_limit, _whole(limit)),
        (name_remaining, _whole(remaining)),
        (name_reset, format_duration(reset_s).encode()),
    ]


def ratelimit_headers(
    *,
    req_limit: float,
    req_remaining: float,
    req_reset_s: float,
    tok_limit: float,
    tok_remaining: float,
    tok_reset_s: float,
) -> list[tuple[bytes, bytes]]:
    """All six headers, requests first. For a tenant with only one of the limits, use
    `limit_headers` for that one."""
    return limit_headers("requests", req_limit, req_remaining, req_reset_s) + limit_headers(
        "tokens", tok_limit, tok_remaining, tok_reset_s
    )
