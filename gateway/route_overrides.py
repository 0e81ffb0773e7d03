"""Where runtime route overrides live, and how every gateway process learns of a change.

`memory://` (one gateway): in this process; a change applies at once and is gone on restart.

`redis://` (several gateways): each route has two keys, `{prefix}route:{name}` (the encoded
`RouteOverride`, absent when the file's weights are in force) and `{prefix}route:{name}:v` (a
counter that grows on every change and is never deleted, so "no override" is a version too). A
write is a compare-and-set on that counter (a Lua script), then a PUBLISH of the route's name on
`{prefix}routes`. Every gateway subscribes and re-reads a route when its name arrives, and every
`resync_s` compares all the routes' counters with what it applied (one MGET) and re-reads those that
differ: a message lost (a dropped subscription, Redis restarted) heals within `resync_s` (2 s by
default) plus one Redis timeout. A new gateway reads every route at start, before it serves.
A Redis that loses its data has no overrides: the gateways go back to the file's weights, together.

Writes raise `OverrideStoreUnavailable` when Redis does not answer (the admin API answers 503);
reading and syncing never raise: a gateway keeps the routes it has until Redis answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from gateway.route_table import RouteOverride

log = logging.getLogger(__name__)

OnChange = Callable[[str, RouteOverride | None], None]
RESYNC_S = 2.0
_TIMEOUT_S = 1.0

_PUT = """
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur ~= tonumber(ARGV[1]) then return {0, cur} end
redis.call('SET', KEYS[2], cur + 1)
redis.call('SET', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return {1, cur + 1}
"""
_CLEAR = """
local v = redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return v
"""


class OverrideStoreUnavailable(Exception):
    """The shared store did not answer a write."""


class OverrideConflict(Exception):
    """Someone else changed the route since it was read; read again and retry."""


class OverrideStore(Protocol):
    shared: bool

    async def start(self, routes: Sequence[str], on_change: OnChange) -> None:
        """Load what is stored (calling `on_change` per route that has an override) and begin
        following changes. Never raises for an unreachable backend."""

    async def stop(self) -> None: ...

    def follow(self, routes: Sequence[str]) -> None:
        """Follow these routes from now on (after a config reload)."""

    async def read(self, name: str) -> tuple[RouteOverride | None, int]:
        """The stored override of `name` (None: the file's) and the version to write against."""

    async def write(self, name: str, override: RouteOverride, expected: int) -> RouteOverride:
        """Store `override` if the version is still `expected` (else OverrideConflict); return it
        with its new version. Every gateway's `on_change` runs with it, this one's before return."""

    async def clear(self, name: str) -> None:
        """Drop the override of `name`: every gateway goes back to the file's weights."""


class MemoryOverrideStore:
    """Overrides of one gateway process."""

    shared = False

    def __init__(self) -> None:
        self._data: dict[str, tuple[RouteOverride | None, int]] = {}
        self._on_change: OnChange = lambda _n, _o: None

    async def start(self, routes: Sequence[str], on_change: OnChange) -> None:
        self._on_change = on_change

    async def stop(self) -> None:
        return None

    def follow(self, routes: Sequence[str]) -> None:
        return None

    async def read(self, name: str) -> tuple[RouteOverride | None, int]:
        return self._data.get(name, (None, 0))

    async def write(self, name: str, override: RouteOverride, expected: int) -> RouteOverride:
        _, version = self._data.get(name, (None, 0))
        if version != expected:
            raise OverrideConflict(name)
        stored = replace(override, version=version + 1)
        self._data[name] = (stored, version + 1)
        self._on_change(name, stored)
        return stored

    async def clear(self, name: str) -> None:
        _, version = self._data.get(name, (None, 0))
        self._data[name] = (None, version + 1)
        self._on_change(name, None)


class RedisOverrideStore:
    """Overrides in Redis, followed through pub/sub and a periodic resync (module doc)."""

    shared = True

    def __init__(self, client: Any, key_prefix: str, resync_s: float = RESYNC_S) -> None:
        self._r = client
        self._prefix = key_prefix
        self._channel = f"{key_prefix}routes"
        self._resync_s = resync_s
        self._routes: tuple[str, ...] = ()
        self._applied: dict[str, int] = {}  # the version each route was last applied at
        self._on_change: OnChange = lambda _n, _o: None
        self._task: asyncio.Task[None] | None = None
        self._put = client.register_script(_PUT)
        self._clear = client.register_script(_CLEAR)
        self._warned = False

    @classmethod
    def from_url(cls, url: str, key_prefix: str, resync_s: float = RESYNC_S) -> RedisOverrideStore:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        client = aioredis.Redis.from_url(
            url, socket_connect_timeout=_TIMEOUT_S, retry=Retry(NoBackoff(), 0), health_check_interval=0
        )
        return cls(client, key_prefix, resync_s)

    @property
    def client(self) -> Any:
        """The Redis client (shared with the adapter loader's lock; closed by `stop`)."""
        return self._r

    def follow(self, routes: Sequence[str]) -> None:
        self._routes = tuple(routes)
        if self._routes and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._follow())

    def _keys(self, name: str) -> tuple[str, str]:
        return f"{self._prefix}route:{name}", f"{self._prefix}route:{name}:v"

    async def start(self, routes: Sequence[str], on_change: OnChange) -> None:
        self._routes = tuple(routes)
        self._on_change = on_change
        if not self._routes:
            return
        await self.resync()
        self._task = asyncio.get_running_loop().create_task(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._r.aclose()

    async def read(self, name: str) -> tuple[RouteOverride | None, int]:
        key, vkey = self._keys(name)
        try:
            async with asyncio.timeout(_TIMEOUT_S):
                raw, version = await self._r.mget(key, vkey)
        except Exception as err:  # RedisError, OSError, TimeoutError: all mean "no answer"
            raise OverrideStoreUnavailable(str(err) or type(err).__name__) from None
        return (None if raw is None else RouteOverride.decode(raw)), int(version or 0)

    async def write(self, name: str, override: RouteOverride, expected: int) -> RouteOverride:
        stored = replace(override, version=expected + 1)
        try:
            async with asyncio.timeout(_TIMEOUT_S):
                ok, version = await self._put(
                    keys=list(self._keys(name)), args=[expected, stored.encode(), self._channel, name]
                )
        except Exception as err:
            raise OverrideStoreUnavailable(str(err)) from None
        if not ok:
            raise OverrideConflict(name)
        self._apply(name, stored, int(version))
        return stored

    async def clear(self, name: str) -> None:
        try:
            async with asyncio.timeout(_TIMEOUT_S):
                version = await self._clear(keys=list(self._keys(name)), args=[self._channel, name])
        except Exception as err:
            raise OverrideStoreUnavailable(str(err)) from None
        self._apply(name, None, int(version))

    def _apply(self, name: str, override: RouteOverride | None, version: int) -> None:
        if self._applied.get(name) == version:
            return
        self._applied[name] = version
        self._on_change(name, override)

    async def resync(self) -> None:
        """Re-read every route whose version differs from the one applied. Never raises."""
        try:
            async with asyncio.timeout(_TIMEOUT_S):
                versions = await self._r.mget([self._keys(n)[1] for n in self._routes])
            for name, v in zip(self._routes, versions, strict=True):
                if self._applied.get(name) != int(v or 0):
                    await self._refresh(name)
            self._warned = False
        except Exception as err:
            self._warn(err)

    async def _refresh(self, name: str) -> None:
        try:
            override, version = await self.read(name)
        except ValueError as err:  # stored by something else than kvgate: leave the route as it is
            log.warning(
                "route %r: the stored override is unreadable (%s); keeping the current one", name, err
            )
            return
        self._apply(name, override, version)

    async def _follow(self) -> None:
        """Subscribe, re-read routes as their names arrive, resync every `resync_s`; reconnect after
        a failure (and resync at once, the messages missed meanwhile are lost)."""
        loop = asyncio.get_running_loop()
        while True:
            pubsub = self._r.pubsub()
            try:
                await pubsub.subscribe(self._channel)
                await self.resync()
                due = loop.time() + self._resync_s
                while True:
                    msg = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=max(0.0, due - loop.time())
                    )
                    if msg is not None and msg.get("type") == "message":
                        name = msg["data"].decode("utf-8", "replace")
                        if name in self._routes:
                            await self._refresh(name)
                    if loop.time() >= due:
                        await self.resync()
                        due = loop.time() + self._resync_s
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self._warn(err)
                await asyncio.sleep(min(self._resync_s, 1.0))
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    def _warn(self, err: BaseException) -> None:
        if not self._warned:
            log.warning("route overrides: Redis unreachable (%s); keeping the routes in force", err)
            self._warned = True
