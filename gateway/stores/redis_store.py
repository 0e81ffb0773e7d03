"""Token buckets and quota counters in Redis, shared by every gateway process that points at the
same server.

Each operation is ONE `EVALSHA` of one script (`bucket.lua`, `quota.lua` and `limits.lua` joined;
loaded once with `SCRIPT LOAD`, reloaded if the server lost its script cache), so a take over a
request's buckets and quota counters is atomic across gateways. The script reads the server's `TIME`
for the buckets: gateways on machines whose clocks disagree still refill one bucket consistently, and
no gateway's clock skew can credit a bucket twice. Quota windows are named by the gateway (its wall
clock; a gateway whose clock is off by s seconds changes windows s seconds early or late).

Keys: `{key_prefix}{<tenant>}:<kind>` for a tenant's buckets, `…:k:<key>:<kind>` for a key's, and
`…:q:<key or ->:<quota>:<window>` for quota counters — the braces are a Redis Cluster hash tag, so
everything one request touches lives on one shard and one script may touch it all. A bucket's TTL is
the time until it is full again plus one second; a counter's is its window's end plus a grace.

Every call is bounded by `timeout_s` (socket timeouts, no client-side retries, and an asyncio timeout
around the whole call); errors surface as `RedisError`/`OSError`/`TimeoutError` for the resilient
wrapper to judge. This class holds no fallback policy of its own.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError

from gateway.stores.base import NO_AMOUNTS, NO_COUNTERS, Bucket, Counter, Level, Settled, Take

SOURCE = "redis"
SCRIPT_FILES = ("bucket.lua", "quota.lua", "limits.lua")
SCRIPT = "\n".join(
    resources.files("gateway.stores").joinpath(f).read_text(encoding="utf-8") for f in SCRIPT_FILES
)


class RedisBucketStore:
    """Buckets in Redis; safe for concurrent use from one event loop (a pool of connections).

    `clock` None (the default) uses the Redis server's TIME; a clock passed here must be shared by
    every writer of the keys (tests pass a fake one to control time). `wall_clock` turns counters'
    `expires_at` into TTLs.
    """

    source = SOURCE

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        key_prefix: str,
        timeout_s: float,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._r = client
        self._prefix = key_prefix
        self._timeout_s = timeout_s
        self._clock = clock
        self._wall = wall_clock
        self._sha: str | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        key_prefix: str,
        timeout_s: float,
        max_connections: int = 256,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> RedisBucketStore:
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # the caller decides what a failure means; no hidden retries
            max_connections=max_connections,
            health_check_interval=0,
        )
        return cls(client, key_prefix=key_prefix, timeout_s=timeout_s, clock=clock, wall_clock=wall_clock)

    @property
    def client(self) -> aioredis.Redis:
        return self._r

    def key(self, b: Bucket | Counter) -> str:
        return f"{self._prefix}{{{b.tenant}}}:{b.name}"

    async def start(self) -> None:
        """Load the script. Raises if Redis cannot be reached (the resilient wrapper handles it)."""
        async with asyncio.timeout(self._timeout_s):
            self._sha = await self._r.script_load(SCRIPT)

    async def close(self) -> None:
        await self._r.aclose()

    async def ping(self) -> None:
        async with asyncio.timeout(self._timeout_s):
            await self._r.ping()

    async def take(
        self,
        buckets: Sequence[Bucket],
        amounts: Sequence[float],
        counters: Sequence[Counter] = NO_COUNTERS,
        counter_amounts: Sequence[float] = NO_AMOUNTS,
    ) -> Take:
        reply = await self.run("take", buckets, amounts, None, counters=counters, ca=counter_amounts)
        return _take(buckets, len(counters), reply)

    async def settle(
        self,
        buckets: Sequence[Bucket],
        reserved: Sequence[float],
        actual: Sequence[float],
        source: str = SOURCE,
        counters: Sequence[Counter] = NO_COUNTERS,
        counter_reserved: Sequence[float] = NO_AMOUNTS,
        counter_actual: Sequence[float] = NO_AMOUNTS,
    ) -> Settled | None:
        reply = await self.run(
            "settle", buckets, reserved, actual, counters=counters, ca=counter_reserved, cb=counter_actual
        )
        used, _, crossed = _counters(len(buckets), len(counters), reply)
        return Settled(_levels(buckets, reply), used, crossed)

    async def peek(self, buckets: Sequence[Bucket]) -> tuple[tuple[Level, ...], str]:
        return _levels(buckets, await self.run("peek", buckets, None, None)), SOURCE

    async def peek_counters(self, counters: Sequence[Counter]) -> tuple[tuple[float, ...], str]:
        reply = await self.run("peek", (), None, None, counters=counters)
        return _counters(0, len(counters), reply)[0], SOURCE

    async def run(
        self,
        op: str,
        buckets: Sequence[Bucket],
        a: Sequence[float] | None,
        b: Sequence[float] | None,
        now: float | None = None,
        *,
        counters: Sequence[Counter] = NO_COUNTERS,
        ca: Sequence[float] | None = None,
        cb: Sequence[float] | None = None,
    ) -> list[bytes]:
        """One script call at `now` (default: the store's clock, or the server's TIME)."""
        if now is None and self._clock is not None:
            now = self._clock()
        args: list[Any] = [op, "" if now is None else repr(float(now)), len(buckets)]
        for i, bk in enumerate(buckets):
            args += (
                repr(float(bk.spec.capacity)),
                repr(float(bk.spec.refill_per_s)),
                repr(float(a[i])) if a is not None else "0",
                repr(float(b[i])) if b is not None else "0",
            )
        if counters:
            wall = self._wall()
            for i, c in enumerate(counters):
                warn = repr(float(c.warn_level)) if c.warn_level is not None else "-1"
                ttl_ms = max(0, math.ceil((c.expires_at - wall) * 1000))
                x = repr(float(ca[i])) if ca is not None else "0"
                y = repr(float(cb[i])) if cb is not None else "0"
                args.append(f"{float(c.limit)!r} {x} {y} {ttl_ms} {warn}")
        keys = [self.key(bk) for bk in buckets] + [self.key(c) for c in counters]
        async with asyncio.timeout(self._timeout_s):
            if self._sha is None:
                self._sha = await self._r.script_load(SCRIPT)
            try:
                reply = await self._r.evalsha(self._sha, len(keys), *keys, *args)
            except NoScriptError:  # the server restarted or flushed its script cache
                self._sha = await self._r.script_load(SCRIPT)
                reply = await self._r.evalsha(self._sha, len(keys), *keys, *args)
        return list(reply)


def _take(buckets: Sequence[Bucket], m: int, reply: list[bytes]) -> Take:
    n = len(buckets)
    levels = tuple(float(reply[3 + 3 * i]) for i in range(n))
    used, refused, crossed = _counters(n, m, reply)
    return Take(
        allowed=reply[0] == b"1",
        retry_after_s=float(reply[2]),
        too_large=reply[1] == b"1",
        limiting=tuple(i for i in range(n) if float(reply[5 + 3 * i]) > 0.0),
        levels=levels,
        reset_s=tuple(float(reply[4 + 3 * i]) for i in range(n)),
        capacities=tuple(b.spec.capacity for b in buckets),
        source=SOURCE,
        used=used,
        counter_limiting=refused,
        crossed=crossed,
    )


def _counters(
    n: int, m: int, reply: list[bytes]
) -> tuple[tuple[float, ...], tuple[int, ...], tuple[int, ...]]:
    """The counters' part of a reply after `n` buckets: used, refusing indexes, crossed indexes."""
    if not m:
        return (), (), ()
    at = 3 + 3 * n
    flags = reply[at + 1]
    return (
        tuple(map(float, reply[at].split())),
        tuple(k for k in range(m) if flags[k] == 0x72),  # b"r"
        tuple(k for k in range(m) if flags[k] == 0x77),  # b"w"
    )


def _levels(buckets: Sequence[Bucket], reply: list[bytes]) -> tuple[Level, ...]:
    return tuple(
        Level(float(reply[3 + 3 * i]), float(reply[4 + 3 * i]), b.spec.capacity)
        for i, b in enumerate(buckets)
    )
