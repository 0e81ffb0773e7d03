"""Where tenants' token-bucket state lives: `memory://` (one process) or `redis://` (shared).

`build_store` turns `state:` config into the store the rate limiter calls; the arithmetic itself is
`policies.token_bucket` in both cases.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.config import StateConfig
from gateway.config_tenancy import LedgerConfig
from gateway.metrics import GatewayMetrics
from gateway.stores.base import (
    Bucket,
    BucketKind,
    BucketStore,
    Counter,
    Level,
    Settled,
    StoreUnavailable,
    Take,
)
from gateway.stores.ledger_store import LedgerStore, MemoryLedgerStore
from gateway.stores.memory import MemoryBucketStore

__all__ = [
    "Bucket",
    "BucketKind",
    "BucketStore",
    "Counter",
    "Level",
    "MemoryBucketStore",
    "Settled",
    "StoreUnavailable",
    "Take",
    "build_ledger_store",
    "build_store",
]


def build_store(
    state: StateConfig,
    metrics: GatewayMetrics,
    clock: Callable[[], float],
    wall_clock: Callable[[], float] = time.time,
    processes: int = 1,
) -> BucketStore:
    """The store `state.store` names. A Redis store comes wrapped in the fail-open/closed policy,
    each of the `processes` sharing the limits (`Config.limit_processes`) keeping 1/processes of
    them while Redis is down. `clock` (monotonic) refills memory buckets; `wall_clock` ages quota
    counters."""
    if state.store == "memory://":
        metrics.store_up.set(1)
        return MemoryBucketStore(clock, wall_clock=wall_clock)
    from gateway.stores.redis_store import RedisBucketStore
    from gateway.stores.resilient import LOCAL, ResilientStore

    remote = RedisBucketStore.from_url(
        state.store, key_prefix=state.key_prefix, timeout_s=state.timeout_s, wall_clock=wall_clock
    )
    return ResilientStore(
        remote,
        MemoryBucketStore(clock, source=LOCAL, wall_clock=wall_clock),
        fail_open=state.on_store_error == "open",
        share=1.0 / processes,
        timeout_s=state.timeout_s,
        probe_min_s=state.probe_min_s,
        probe_max_s=state.probe_max_s,
        metrics=metrics,
    )


def build_ledger_store(
    state: StateConfig, ledger: LedgerConfig, wall_clock: Callable[[], float] = time.time
) -> LedgerStore:
    """Where the usage ledger is kept: with the limits (memory, or the same Redis). Ledger calls are
    off the request path, so they get a longer timeout than the limits' (at least 2 s)."""
    if state.store == "memory://":
        return MemoryLedgerStore(ledger.retention_days, wall_clock)
    from gateway.stores.ledger_store import RedisLedgerStore

    return RedisLedgerStore.from_url(
        state.store,
        key_prefix=state.key_prefix,
        retention_days=ledger.retention_days,
        timeout_s=max(2.0, state.timeout_s),
    )
