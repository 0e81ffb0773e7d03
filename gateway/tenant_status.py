"""What the admin API shows of a tenant: its policy (and which parts the API set), what this gateway
saw it use, its buckets' levels, every quota's use and reset time, and its keys.

Read-only views over `Tenancy`; the store is read at most twice per call (buckets, then every quota
counter of the tenant and its keys in one call), each bounded by `_STORE_WAIT_S`.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

from gateway.quotas import Quota
from gateway.stores.base import StoreUnavailable
from gateway.tenants import KeyEntry, KeyPolicy, Tenant
from policies.quota import remaining
from policies.quota_window import iso_local

if TYPE_CHECKING:
    from gateway.tenancy import Tenancy

_STORE_WAIT_S = 2.0
_FAILURES = (StoreUnavailable, TimeoutError, OSError)


def limits_of(t: Tenant) -> dict[str, Any]:
    return {
        "rpm": t.rpm,
        "tpm": t.tpm,
        "max_concurrency": t.max_concurrency,
        "max_output_tokens": t.max_output_tokens,
    }


def quota_config(q: Quota) -> dict[str, Any]:
    out: dict[str, Any] = {"name": q.name, q.unit: q.limit, "per": q.period, "timezone": q.tz.key}
    if q.warn_at is not None:
        out["warn_at"] = q.warn_at
    if q.config.models is not None:
        out["models"] = list(q.config.models)
    out["source"] = q.source
    return out


def quota_use(q: Quota, used: float | None, now: float) -> dict[str, Any]:
    """A quota with its use in the current window (`used` None: the store could not say)."""
    w = q.window(now)
    out = quota_config(q)
    out["window"] = {"label": w.label, "start": iso_local(w.start, q.tz), "end": iso_local(w.end, q.tz)}
    out["used"] = None if used is None else math.floor(used)
    out["remaining"] = None if used is None else math.floor(remaining(q.limit, used))
    out["resets_at"] = iso_local(w.end, q.tz)
    out["reset_s"] = math.ceil(w.reset_s(now))
    return out


def overrides_of(tenancy: Tenancy, name: str) -> dict[str, Any] | None:
    """What the admin API set for tenant `name` (shown as such), or None."""
    patch = tenancy.registry.overrides.tenants.get(name)
    if patch is None:
        return None
    out: dict[str, Any] = {"limits": dict(patch.limits)}
    if patch.quotas is not None:
        out["quotas"] = [q.model_dump(exclude_none=True) for q in patch.quotas]
    out["updated_at"] = patch.updated_at
    out["updated_by"] = patch.updated_by
    return out


def summary(tenancy: Tenancy, t: Tenant) -> dict[str, Any]:
    """What this gateway knows about `t` without asking the store."""
    totals = tenancy.totals.get(t.name)
    return {
        "name": t.name,
        "priority": t.band.label,
        "weight": t.weight,
        "limits": limits_of(t),
        "quotas": [quota_config(q) for q in t.quotas],
        "overrides": overrides_of(tenancy, t.name),
        "keys": len(tenancy.registry.keys_of(t.name)),
        "in_flight": tenancy.in_flight.get(t.name, 0),
        "queued": tenancy.admission.depth_of(t.name) if tenancy.admission is not None else 0,
        "used": {
            "requests": totals.requests if totals else 0,
            "tokens": totals.tokens if totals else 0,
            "since": tenancy.started_at,
        },
    }


def key_view(entry: KeyEntry) -> dict[str, Any]:
    k = entry.principal.key
    assert k is not None
    r = entry.record
    return {
        "name": k.name,
        "source": k.source,
        "created_at": r.created_at if r is not None else None,
        "created_by": r.created_by if r is not None else None,
        "limits": {"rpm": k.rpm, "tpm": k.tpm, "max_concurrency": k.max_concurrency},
        "quotas": [quota_config(q) for q in k.quotas],
    }


async def status(tenancy: Tenancy, t: Tenant) -> dict[str, Any]:
    """`summary` plus the buckets' levels and every quota's use (the tenant's and its keys'), read
    from the store now."""
    out = summary(tenancy, t)
    out["buckets"] = {}
    keys = tenancy.registry.keys_of(t.name)
    out["keys"] = [key_view(e) for e in keys]
    limiter = tenancy.limiter
    if limiter is None:
        return out
    now = limiter.wall_clock()
    key_quotas: list[tuple[KeyPolicy, Quota]] = [
        (e.principal.key, q) for e in keys if e.principal.key is not None for q in e.principal.key.quotas
    ]
    everything = [*t.quotas, *(q for _, q in key_quotas)]
    used: tuple[float, ...] | None = None
    try:
        async with asyncio.timeout(_STORE_WAIT_S):
            if t.buckets:
                levels, source = await limiter.peek(t)
                out["store"] = source
                for b, lv in zip(t.buckets, levels, strict=True):
                    out["buckets"][b.kind] = {
                        "capacity": lv.capacity,
                        "level": lv.level,
                        "remaining": max(0, int(lv.level)),
                        "refill_per_s": b.spec.refill_per_s,
                        "reset_s": lv.reset_s,
                    }
            if everything:
                used, source = await limiter.store.peek_counters([q.counter(now) for q in everything])
                out["store"] = source
    except _FAILURES:
        out["buckets"] = None
        out["store"] = "unavailable"
    n = len(t.quotas)
    out["quotas"] = [quota_use(q, used[i] if used else None, now) for i, q in enumerate(t.quotas)]
    by_key: dict[str, list[dict[str, Any]]] = {}
    for j, (k, q) in enumerate(key_quotas):
        by_key.setdefault(k.name, []).append(quota_use(q, used[n + j] if used else None, now))
    for view in out["keys"]:
        view["quotas"] = by_key.get(view["name"], [])
    return out
