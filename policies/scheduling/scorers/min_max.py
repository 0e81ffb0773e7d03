"""Min-max normalization for load-like signals, where less is better."""

from __future__ import annotations

from collections.abc import Sequence


def inverted_min_max(values: Sequence[float]) -> list[float]:
    """(max - v) / (max - min) for each value: the least becomes 1.0, the most 0.0.

    All equal (or a single value) gives 1.0 for each: no candidate is worse than another. Empty in,
    empty out.
    """
    if not values:
        return []
    low = min(values)
    high = max(values)
    if high == low:
        return [1.0] * len(values)
    span = high - low
    return [(high - v) / span for v in values]
