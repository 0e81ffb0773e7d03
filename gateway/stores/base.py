"""The limit store contract: atomic take, settle and peek over token buckets and quota counters.

A request meets up to two buckets (requests, tokens) of its tenant, two more of its key, and the quota
counters of both (`policies.quota`); one admission takes from all of them or from none, in ONE store
operation (one Redis round trip), and one settle reconciles all of them in one more.

Units: levels, amounts and capacities are in the bucket's unit (requests or tokens), floats; times and
durations are seconds. The store owns the clock its buckets are written with (a process's monotonic
clock for memory, the Redis server's TIME for Redis), so callers never pass `now`. Quota windows are
the caller's: it names the window in the `Counter` and says when its state may go (`expires_at`, on
the gateway's wall clock, which the store is handed as `wall_clock`).

Concurrency: every method is safe to call concurrently from one event loop; each call is atomic on
its own (the memory store never yields inside one, the Redis store runs one Lua script).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
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
    """One limit of one tenant, or of one named key of a tenant (`key`). `tenant` and `name` name its
    state in the store (`name` is the kind, or `k:<key>:<kind>`); `spec` is the limit as configured
    (a store may scale it, e.g. the fail-open share)."""

    tenant: str
    kind: BucketKind
    spec: BucketSpec
    key: str | None = None
    name: str = field(init=False, repr=False, compare=False)
    id: tuple[str, str] = field(init=False, repr=False, compare=False)  # (tenant, name), built once

    def __post_init__(self) -> None:
        name = self.kind if self.key is None else f"k:{self.key}:{self.kind}"
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "id", (self.tenant, name))


@dataclass(frozen=True, slots=True)
class Counter:
    """One quota of a tenant (or key) in one calendar window (`policies.quota`).

    `tenant` and `name` name its state in the store (`name` is unique per quota and window, e.g.
    `q:ci-bot:tokens-per-day:2026-12-03`); `limit` is in the quota's unit (tokens or requests);
    `expires_at` is when its state may be dropped (Unix seconds, the gateway's wall clock: the
    window's end plus a grace for requests still running); `warn_level` is the `used` whose first
    crossing in the window is reported (`Take.crossed`), or None.
    """

    tenant: str
    name: str
    limit: float
    expires_at: float
    warn_level: float | None = None
    id: tuple[str, str] = field(init=False, repr=False, compare=False)  # (tenant, name), built once

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", (self.tenant, self.name))


class Take(NamedTuple):  # a NamedTuple, not a dataclass: built on every request, 3x cheaper
    """Outcome of taking from several buckets at once; per-bucket tuples follow the order given.

    `levels` are the buckets' levels after the take (debited only when `allowed`; may be negative
    after an overrun was settled); `reset_s` seconds until each is full again. `retry_after_s` is 0
    when allowed, `math.inf` with `too_large` when some amount exceeds its bucket's capacity.
    `limiting` indexes the buckets that refused. `capacities` are the limits that were applied (a
    fail-open fallback applies a share). `source` says which store took it; hand it back to `settle`.

    Counters, in the order given: `used` after the take (debited only when `allowed`),
    `counter_limiting` the ones that refused ("would exceed"), `crossed` the ones whose warn level
    this take crossed (reported once per window, to the caller that crossed it). When only counters
    refuse, `retry_after_s` is 0: the caller knows when its windows end.
    """

    allowed: bool
    retry_after_s: float
    too_large: bool
    limiting: tuple[int, ...]
    levels: tuple[float, ...]
    reset_s: tuple[float, ...]
    capacities: tuple[float, ...]
    source: str
    used: tuple[float, ...] = ()
    counter_limiting: tuple[int, ...] = ()
    crossed: tuple[int, ...] = ()


class Settled(NamedTuple):
    """After a settle: the buckets' `levels`, the counters' `used` (0 for a counter whose window is
    over) and the counters whose warn level the settle `crossed`."""

    levels: tuple[Level, ...]
    used: tuple[float, ...] = ()
    crossed: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Level:
    """One bucket as it stands: `level` (may be negative: debt) and seconds until full."""

    level: float
    reset_s: float
    capacity: float


NO_COUNTERS: tuple[Counter, ...] = ()
NO_AMOUNTS: tuple[float, ...] = ()


class BucketStore(Protocol):
    async def start(self) -> None:
        """Connect and prepare (load the script). Never raises for an unreachable backend: a store
        that can fail degrades as configured instead."""

    async def close(self) -> None: ...

    async def take(
        self,
        buckets: Sequence[Bucket],
        amounts: Sequence[float],
        counters: Sequence[Counter] = NO_COUNTERS,
        counter_amounts: Sequence[float] = NO_AMOUNTS,
    ) -> Take:
        """Take `amounts[i]` (>= 0) from `buckets[i]` and add `counter_amounts[j]` to `counters[j]`,
        all or nothing. Raises StoreUnavailable (fail-closed only)."""

    async def settle(
        self,
        buckets: Sequence[Bucket],
        reserved: Sequence[float],
        actual: Sequence[float],
        source: str,
        counters: Sequence[Counter] = NO_COUNTERS,
        counter_reserved: Sequence[float] = NO_AMOUNTS,
        counter_actual: Sequence[float] = NO_AMOUNTS,
    ) -> Settled | None:
        """Give back `reserved[i] - actual[i]` to `buckets[i]` (negative: charge the overrun), and the
        same to the counters, in the store named by `source` (from the `Take`). Never raises;
        returns None when the settle was dropped (the store that took it is unreachable)."""

    async def peek(self, buckets: Sequence[Bucket]) -> tuple[tuple[Level, ...], str]:
        """The buckets' levels now, without changing them, and the source they were read from.
        Raises StoreUnavailable when no store can answer."""

    async def peek_counters(self, counters: Sequence[Counter]) -> tuple[tuple[float, ...], str]:
        """The counters' `used` now (0 for a missing one) and the source; as `peek`."""
