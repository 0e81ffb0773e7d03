"""Slow start: a replica that has just become ready gets a growing share of the requests it would
otherwise be chosen for, instead of all of them at once.

A replica that just started has an empty prefix cache, cold CUDA graphs and an empty engine queue:
every load-aware scorer makes it the best candidate, so without a ramp it takes a burst that it
serves slower than its peers. Its weight grows linearly with its age in service, from `min_weight`
to 1 over `ramp_s` seconds (as Envoy's slow start does with aggression 1).

Selection is thinned without randomness: `keeps(sequence, name, weight)` is True for a `weight`
share of consecutive request sequence numbers (a Weyl sequence offset by the replica's name, so two
ramping replicas are not kept on the same requests). Pure: ages are seconds on the caller's clock.
"""

from __future__ import annotations

import zlib

_GOLDEN = 0.6180339887498949  # frac(phi): consecutive multiples spread evenly over [0, 1)
DEFAULT_MIN_WEIGHT = 0.1


def slow_start_weight(age_s: float, ramp_s: float, min_weight: float = DEFAULT_MIN_WEIGHT) -> float:
    """The share (in [min_weight, 1]) of its normal selection a replica gets `age_s` seconds after
    it became ready, ramping over `ramp_s` seconds. `ramp_s <= 0` means no ramp (1.0); a negative
    age (clock skew) counts as 0. `min_weight` in (0, 1]."""
    if not 0.0 < min_weight <= 1.0:
        raise ValueError(f"min_weight must be in (0, 1], got {min_weight}")
    if ramp_s <= 0 or age_s >= ramp_s:
        return 1.0
    return max(min_weight, max(age_s, 0.0) / ramp_s)


def name_offset(name: str) -> float:
    """A stable point in [0, 1) for a replica name (the same in every process)."""
    return zlib.crc32(name.encode()) / 2**32


def keeps(sequence: int, name: str, weight: float) -> bool:
    """Whether the replica stays a candidate for request number `sequence`: True for a `weight`
    share of any run of consecutive sequence numbers (within about one per hundred), False
    always for weight <= 0, True always for weight >= 1."""
    if weight >= 1.0:
        return True
    point = (sequence * _GOLDEN + name_offset(name)) % 1.0
    return point < weight
