"""Service-level objectives for goodput: parse `ttft=1s,tpot=50ms,e2e=10s,itl=200ms`.

An `Slo` holds up to four latency thresholds in seconds; a threshold that is None is not checked.
What each one bounds (the definitions are `loadtests.measures`'):

- `ttft_s` — time to first token: send to first content byte;
- `tpot_s` — time per output token after the first: (E2E - TTFT) / (output tokens - 1);
- `e2e_s` — end-to-end latency: send to the stream's end;
- `itl_s` — inter-token latency: the largest gap between two content chunks of the request.

A request meets the SLO when it succeeded and every threshold that is set holds (see
`loadtests.measures.meets_slo`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNITS = {"ms": 1e-3, "s": 1.0}
_KEYS = ("ttft", "tpot", "e2e", "itl")
_VALUE = re.compile(r"^\s*(?P<number>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?P<unit>[a-zA-Z]*)\s*$")


class SloError(ValueError):
    """An SLO string that cannot be read; the message names the part at fault and what was expected."""


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency thresholds in seconds (> 0); None means "not checked". Immutable."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    itl_s: float | None = None

    def as_dict(self) -> dict[str, float]:
        """The thresholds that are set, keyed `ttft_s`, `tpot_s`, `e2e_s`, `itl_s` (seconds)."""
        pairs = (
            ("ttft_s", self.ttft_s),
            ("tpot_s", self.tpot_s),
            ("e2e_s", self.e2e_s),
            ("itl_s", self.itl_s),
        )
        return {k: v for k, v in pairs if v is not None}

    def __str__(self) -> str:
        return ",".join(f"{k.removesuffix('_s')}={_format_seconds(v)}" for k, v in self.as_dict().items())


def parse_slo(text: str) -> Slo:
    """Read `key=value[,key=value...]` where key is ttft, tpot, e2e or itl and value is a positive
    number with a unit, `ms` or `s` (e.g. `1s`, `50ms`, `0.5s`). Keys are case-insensitive; each at most
    once. Raises `SloError` on an empty string, an unknown or repeated key, a missing or unknown unit, or a
    value that is not a positive number."""
    if not text.strip():
        raise SloError("empty SLO: expected e.g. 'ttft=1s,tpot=50ms'")
    values: dict[str, float] = {}
    for part in text.split(","):
        key, sep, raw = part.partition("=")
        key = key.strip().lower()
        if not sep or not key:
            raise SloError(f"SLO part {part.strip()!r} is not key=value (e.g. 'ttft=1s')")
        if key not in _KEYS:
            raise SloError(f"unknown SLO key {key!r}: expected one of {', '.join(_KEYS)}")
        if key in values:
            raise SloError(f"SLO key {key!r} given twice")
        values[key] = _parse_seconds(key, raw)
    return Slo(
        ttft_s=values.get("ttft"), tpot_s=values.get("tpot"), e2e_s=values.get("e2e"), itl_s=values.get("itl")
    )


def _parse_seconds(key: str, raw: str) -> float:
    match = _VALUE.match(raw)
    if match is None:
        raise SloError(f"SLO {key}={raw.strip()!r}: expected a positive number with a unit, e.g. 50ms or 1s")
    unit = match["unit"].lower()
    if not unit:
        raise SloError(f"SLO {key}={raw.strip()!r} has no unit: write ms or s (e.g. {raw.strip()}ms)")
    if unit not in _UNITS:
        raise SloError(f"SLO {key}={raw.strip()!r}: unknown unit {match['unit']!r}, expected ms or s")
    seconds = float(match["number"]) * _UNITS[unit]
    if seconds <= 0:
        raise SloError(f"SLO {key}={raw.strip()!r} must be greater than zero")
    return seconds


def _format_seconds(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds:g}s"
