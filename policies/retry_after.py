"""`Retry-After` values (whole seconds, RFC 9110 delay-seconds) for the two kinds of refusal.

- A rate limit (429): the bucket says when it will hold enough (`TakeResult.retry_after_s`).
- Overload (503, or 429 for a queue limit): the work ahead of the client divided by how fast the fleet
  drains it (`DrainRate`); with no drain observed, a configured fallback.

Both round up (a client that waits the advertised time should not be refused again for a fraction of
a second) and are at least 1 (0 invites an immediate retry storm).
"""

from __future__ import annotations

import math

# Float noise from `(amount - level) / refill_per_s` must not turn an exact 2 s into 3 s.
_ROUNDING_SLACK_S = 1e-9


def _ceil_seconds(seconds: float) -> int:
    return math.ceil(seconds - _ROUNDING_SLACK_S)


def retry_after_from_bucket(seconds: float, *, cap_s: int = 3600) -> int:
    """Whole seconds to advertise for a bucket that needs `seconds` more: ceil, within [1, cap_s].
    `inf` (a request larger than the limit) gives `cap_s`, but such a refusal should rather say
    "request too large" and carry no Retry-After at all, since waiting never helps."""
    if cap_s < 1:
        raise ValueError("cap_s must be >= 1")
    if math.isnan(seconds) or seconds >= cap_s:
        return cap_s
    return max(1, _ceil_seconds(seconds))


def retry_after_from_queue(
    ahead: float,
    drain_per_s: float,
    *,
    fallback_s: int,
    floor_s: int = 1,
    cap_s: int = 60,
) -> int:
    """Whole seconds until the work `ahead` (requests or tokens, including the refused request's own
    if it should count) drains at `drain_per_s` (same unit, per second), clamped to [floor_s, cap_s].
    When the rate is unknown (0, negative or not finite) the answer is `fallback_s`, clamped too."""
    if not 1 <= floor_s <= cap_s:
        raise ValueError("need 1 <= floor_s <= cap_s")
    if not (drain_per_s > 0 and math.isfinite(drain_per_s)) or math.isnan(ahead):
        seconds = float(fallback_s)
    else:
        seconds = max(0.0, ahead) / drain_per_s
    if seconds >= cap_s:
        return cap_s
    return max(floor_s, _ceil_seconds(seconds))
