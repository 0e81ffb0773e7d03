"""`fresh`: drop replicas whose last good scrape is older than `ctx.stale_after_s`. Soft."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.scheduling.context import SchedulingContext
from policies.types import ReplicaState


@dataclass(frozen=True, slots=True)
class FreshFilter:
    """Keeps replicas scraped at most `ctx.stale_after_s` seconds before `ctx.now`.

    A replica never scraped is stale. Soft: when the whole pool is stale (the scraper is behind, or
    the metrics endpoint is down everywhere) routing on the gateway's own in-flight counts beats
    refusing every request.
    """

    name: str = "fresh"
    soft: ClassVar[bool] = True

    def filter(self, ctx: SchedulingContext, candidates: Sequence[ReplicaState]) -> Sequence[ReplicaState]:
        now = ctx.now
        stale_after_s = ctx.stale_after_s
        for r in candidates:
            scraped = r.scraped_at
            if scraped is None or not now - scraped <= stale_after_s:
                return [
                    s for s in candidates if s.scraped_at is not None and now - s.scraped_at <= stale_after_s
                ]
        return candidates  # the common case: every scrape is fresh, nothing to copy
