"""How fast is work leaving the fleet? An exponentially weighted rate of completions.

Each completion adds its count (requests, tokens) to a counter that decays continuously by
`exp(-dt / time_constant_s)`. For a steady rate r the counter tends to `r * time_constant_s`, so

    rate(now) = counter(now) / max(min_window_s, time_constant_s * (1 - exp(-age / time_constant_s)))

where `age = now - started_at`. The denominator is the effective window seen so far: right after
start it is short, so the first completions are not diluted by time before the estimator existed
(`min_window_s` keeps one early completion from reading as a huge rate). While idle the counter and
so the rate decay toward 0; with nothing observed the rate is exactly 0 ("unknown": the caller falls
back to a configured Retry-After).

State: mutable, owned by one event loop; `now` is injected (monotonic seconds). A clock that goes
backwards decays nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DrainRates:
    """Completions per second: requests and tokens (the unit the caller observed)."""

    requests_per_s: float
    tokens_per_s: float


class DrainRate:
    """EWMA estimate of completions per second, in requests and in tokens."""

    def __init__(self, now: float, *, time_constant_s: float = 10.0, min_window_s: float = 1.0) -> None:
        if not (time_constant_s > 0 and math.isfinite(time_constant_s)):
            raise ValueError("time_constant_s must be a positive finite number of seconds")
        if not 0 < min_window_s <= time_constant_s:
            raise ValueError("min_window_s must be in (0, time_constant_s]")
        self._tau = time_constant_s
        self._min_window = min_window_s
        self._started_at = now
        self._updated_at = now
        self._requests = 0.0
        self._tokens = 0.0

    def observe(self, now: float, requests: float = 1, tokens: float = 0) -> None:
        """Record completions at `now`. Use one token unit throughout (e.g. the finished requests'
        reservations if Retry-After compares against queued reservations)."""
        if not (requests >= 0 and tokens >= 0):
            raise ValueError("completions cannot be negative")
        f = self._decay(now)
        if now > self._updated_at:
            self._updated_at = now
        self._requests = self._requests * f + requests
        self._tokens = self._tokens * f + tokens

    def rates(self, now: float) -> DrainRates:
        """Estimated completions per second at `now` (>= 0; 0 when nothing was observed)."""
        scale = self._decay(now) / self._window(now)
        return DrainRates(self._requests * scale, self._tokens * scale)

    def requests_per_s(self, now: float) -> float:
        return self.rates(now).requests_per_s

    def tokens_per_s(self, now: float) -> float:
        return self.rates(now).tokens_per_s

    def _decay(self, now: float) -> float:
        dt = now - self._updated_at
        return math.exp(-dt / self._tau) if dt > 0 else 1.0

    def _window(self, now: float) -> float:
        age = max(0.0, now - self._started_at)
        return max(self._min_window, self._tau * -math.expm1(-age / self._tau))
