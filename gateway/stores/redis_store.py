"""Token buckets in Redis, shared by every gateway process that points at the same server.

Each operation is ONE `EVALSHA` of `bucket.lua` (loaded once with `SCRIPT LOAD`, reloaded if the
server lost its script cache), so a take over the requests and tokens buckets of a tenant is atomic
across gateways. The script reads the server's `TIME`: gateways on machines whose clocks disagree
still refill one bucket consistently, and no gateway's clock skew can credit a bucket twice.

Keys: `{key_prefix}{<tenant>}:<kind>` — the braces are a Redis Cluster hash tag, so one tenant's two
buckets live on one shard and one script may touch both. Each key's TTL is the time until the bucket
is full again plus one second.

Every call is bounded by `timeout_s` (socket timeouts, no client-side retries, and an asyncio timeout
around the whole call); errors surface as `RedisError`/`OSError`/`TimeoutError` for the resilient
wrapper to judge. This class holds no fallback policy of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError

from gateway.stores.base import Bucket, Level, Take

SOURCE = "redis"
SCRIPT = resources.files("gateway.stores").joinpath("bucket.lua").read_text(encoding="utf-8")


class RedisBucketStore:
    """Buckets in Redis; safe for concurrent use from one event loop (a pool of connections).

    `clock` None (the default) uses the Redis server's TIME; a clock passed here must be shared by
    every writer of the keys (tests pass a fake one to control time).
    """

    source = SOURCE

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        key_prefix: str,
        timeout_s: float,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._r = client
        self._prefix = key_prefix
        self._timeout_s = timeout_s
        self._clock = clock
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
    ) -> RedisBucketStore:
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # the caller decides what a failure means; no hidden retries
            max_connections=max_connections,
            health_check_interval=0,
        )
        return cls(client, key_prefix=key_prefix, timeout_s=timeout_s, clock=clock)

    def key(self, b: Bucket) -> str:
        return f"{self._prefix}{{{b.tenant}}}:{b.kind}"

    async def start(self) -> None:
        """Load the script. Raises if Redis cannot be reached (the resilient wrapper handles it)."""
        async with asyncio.timeout(self._timeout_s):
            self._sha = await self._r.script_load(SCRIPT)

    async def close(self) -> None:
        await self._r.aclose()

    async def ping(self) -> None:
        async with asyncio.timeout(self._timeout_s):
            await self._r.ping()

    async def take(self, buckets: Sequence[Bucket], amounts: Sequence[float]) -> Take:
        reply = await self.run("take", buckets, amounts, None)
        return _take(buckets, reply)

    async def settle(
        self,
        buckets: Sequence[Bucket],
        reserved: Sequence[float],
        actual: Sequence[float],
        source: str = SOURCE,
    ) -> tuple[Level, ...] | None:
        return _levels(buckets, await self.run("settle", buckets, reserved, actual))

    async def peek(self, buckets: Sequence[Bucket]) -> tuple[tuple[Level, ...], str]:
        return _levels(buckets, await self.run("peek", buckets, None, None)), SOURCE

    async def run(
        self,
        op: str,
        buckets: Sequence[Bucket],
        a: Sequence[float] | None,
        b: Sequence[float] | None,
        now: float | None = None,
    ) -> list[bytes]:
        """One script call at `now` (default: the store's clock, or the server's TIME)."""
        if now is None and self._clock is not None:
            now = self._clock()
        args: list[Any] = [op, "" if now is None else repr(float(now))]
        for i, bk in enumerate(buckets):
            args += (
                repr(float(bk.spec.capacity)),
                repr(float(bk.spec.refill_per_s)),
                repr(float(a[i])) if a is not None else "0",
                repr(float(b[i])) if b is not None else "0",
            )
        keys = [self.key(bk) for bk in buckets]
        async with asyncio.timeout(self._timeout_s):
            if self._sha is None:
                self._sha = await self._r.script_load(SCRIPT)
            try:
                reply = await self._r.evalsha(self._sha, len(keys), *keys, *args)
            except NoScriptError:  # the server restarted or flushed its script cache
                self._sha = await self._r.script_load(SCRIPT)
                reply = await self._r.evalsha(self._sha, len(keys), *keys, *args)
        return list(reply)


def _take(buckets: Sequence[Bucket], reply: list[bytes]) -> Take:
    n = len(buckets)
    levels = tuple(float(reply[3 + 3 * i]) for i in range(n))
    return Take(
        allowed=reply[0] == b"1",
        retry_after_s=float(reply[2]),
        too_large=reply[1] == b"1",
        limiting=tuple(i for i in range(n) if float(reply[5 + 3 * i]) > 0.0),
        levels=levels,
        reset_s=tuple(float(reply[4 + 3 * i]) for i in range(n)),
        capacities=tuple(b.spec.capacity for b in buckets),
        source=SOURCE,
    )


def _levels(buckets: Sequence[Bucket], reply: list[bytes]) -> tuple[Level, ...]:
    return tuple(
        Level(float(reply[3 + 3 * i]), float(reply[4 + 3 * i]), b.spec.capacity)
        for i, b in enumerate(buckets)
    )
