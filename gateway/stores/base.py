"""The bucket store contract: atomic multi-bucket take, settle and peek over `policies.token_bucket`.

A tenant has up to two buckets (requests, tokens); one admission takes from all of them or from none,
in ONE store operation (one Redis round trip), and one settle reconciles all of them in one more.

Units: levels, amounts and capacities are in the bucket's unit (requests or tokens), floats; times and
durations are seconds. The store owns the clock its state is written with (a process's monotonic
clock for memory, the Redis server's TIME for Redis), so callers never pass `now`.

Concurrency: every method is safe to call concurrently from one event loop; each call is atomic on
its own (the memory store never yields inside one, the Redis store runs one Lua script).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

from policies.token_bucket import BucketSpec

BucketKind = Literal["requests", "tokens"]


class StoreUnavailable(Exception):
    """The store cannot answer and the configured failure mode is to refuse (fail-closed).
    `retry_after_s` is when it is worth asking again."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("rate limit state store unavailable")
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class Bucket:
    """One limit of one tenant. `tenant` and `kind` name its state in the store; `spec` is the limit
    as configured (a store may scale it, e.g. the fail-open share)."""

    tenant: str
    kind: BucketKind
    spec: BucketSpec


class Take(NamedTuple):  # a NamedTuple, not a dataclass: built on every request, 3x cheaper
    """Outcome of taking from several buckets at once; per-bucket tuples follow the order given.

    `levels` are the buckets' levels after the take (debited only when `allowed`; may be negative
    after an overrun was settled); `reset_s` seconds until each is full again. `retry_after_s` is 0
    when allowed, `math.inf` with `too_large` when some amount exceeds its bucket's capacity.
    `limiting` indexes the buckets that refused. `capacities` are the limits that were applied (a
    fail-open fallback applies a share). `source` says which store took it; hand it back to `settle`.
    """

    allowed: bool
    retry_after_s: float
    too_large: bool
    limiting: tuple[int, ...]
    levels: tuple[float, ...]
    reset_s: tuple[float, ...]
    capacities: tuple[float, ...]
    source: str


@dataclass(frozen=True, slots=True)
class Level:
    """One bucket as it stands: `level` (may be negative: debt) and seconds until full."""

    level: float
    reset_s: float
    capacity: float


class BucketStore(Protocol):
    async def start(self) -> None:
        """Connect and prepare (load the script). Never raises for an unreachable backend: a store
        that can fail degrades as configured instead."""

    async def close(self) -> None: ...

    async def take(self, buckets: Sequence[Bucket], amounts: Sequence[float]) -> Take:
        """Take `amounts[i]` (>= 0) from `buckets[i]`, from all or from none. Raises StoreUnavailable
        (fail-closed only)."""

    async def settle(
        self,
        buckets: Sequence[Bucket],
        reserved: Sequence[float],
        actual: Sequence[float],
        source: str,
    ) -> tuple[Level, ...] | None:
        """Give back `reserved[i] - actual[i]` to `buckets[i]` (negative: charge the overrun) in the
        store named by `source` (from the `Take`). Never raises; returns None when the settle was
        dropped (the store that took the reservation is unreachable)."""

    async def peek(self, buckets: Sequence[Bucket]) -> tuple[tuple[Level, ...], str]:
        """The buckets' levels now, without changing them, and the source they were read from.
        Raises StoreUnavailable when no store can answer."""
