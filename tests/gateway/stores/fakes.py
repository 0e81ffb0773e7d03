"""Small helpers shared by the store tests: a settable clock and bucket factories."""

from __future__ import annotations

from gateway.stores.base import Bucket, BucketKind
from policies.token_bucket import BucketSpec


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def bucket(tenant: str, kind: BucketKind, capacity: float, refill_per_s: float) -> Bucket:
    return Bucket(tenant, kind, BucketSpec(capacity, refill_per_s))
