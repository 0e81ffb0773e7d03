"""Adapter placement: load an adapter that no healthy replica holds, so the request for it is served.

`ensure(pool, adapter)` returns once a healthy replica of `pool` lists `adapter`, loading it first if
needed: on the best-placed replica (policies/adapter_placement: LoRA enabled, free slots, fewest
adapters, least load), through vLLM's `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` with
the source path from `models[].adapters`, trying the next replica when one refuses. Before loading,
the replica sheds the least recently used adapters beyond `max_adapters_per_replica` (only adapters
kvgate can load again, never one running there or with this gateway's requests in flight there)
through `POST /v1/unload_lora_adapter`. Then the replica's `/v1/models` is read at once and handed
to `FleetState.record_models`, so routing sees the adapter without waiting for the next poll.

One load at a time per (pool, adapter) in a gateway: concurrent requests wait on the same task
(single-flight; a waiter leaving does not cancel the load). Across gateways sharing Redis, a lock
(`SET {prefix}adapter-load:{pool}:{adapter} NX PX <timeout>`) admits one loader; the others watch
the pool's `/v1/models` every 0.2 s until the adapter shows up, or the lock frees and they try
themselves. The holder re-reads the pool's models after taking the lock, so an adapter another
gateway has just loaded is not loaded twice. A load lasts at most the pool's `adapter_load_timeout_s`;
waiters are bounded by the same time (the caller answers 503 with Retry-After past it).

Known race: a request of another gateway may reach a replica just as this one unloads an adapter
there (that gateway's picture is up to a poll old); it gets the replica's 404. Unloads are rare
(only past the limit) and pick the least recently used adapter not running there.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.config import Config, ModelConfig
from gateway.fleet.models_parse import parse_models
from gateway.fleet.state import FleetState
from gateway.replica_auth import ReplicaCredentials
from gateway.route_metrics import RouteMetrics
from gateway.upstream import UpstreamPool
from policies.adapter_placement import adapters_to_evict, placement_order
from policies.model_names import canonical
from policies.types import ReplicaState

log = logging.getLogger(__name__)

_WATCH_S = 0.2  # how often a gateway that did not get the lock looks for the adapter
_CALL_S = 10.0  # one load / unload / models call to a replica

_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class AdapterLoadFailed(Exception):
    """No replica could load the adapter (or none is healthy); the message says why."""


class AdapterLoader:
    """Adapter placement for one Gateway, on one event loop. `bind` the upstream pool before use."""

    def __init__(
        self,
        config: Config,
        fleet: FleetState,
        metrics: RouteMetrics,
        redis: Any = None,
        key_prefix: str = "kvgate:",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fleet = fleet
        self._m = metrics
        self._redis = redis
        self._prefix = key_prefix
        self._clock = clock
        self.configure(config)
        self._default_timeout: float = ModelConfig.model_fields["adapter_load_timeout_s"].default
        self._loads: dict[tuple[str, str], asyncio.Task[str]] = {}
        self._last_used: dict[tuple[str, str], float] = {}  # (replica, adapter) -> clock
        self._busy: dict[tuple[str, str], int] = {}  # (replica, adapter) -> requests in flight
        self._pool: UpstreamPool | None = None
        self._credentials = ReplicaCredentials({}, {})
        self._unlock = redis.register_script(_UNLOCK) if redis is not None else None

    def bind(self, pool: UpstreamPool, credentials: ReplicaCredentials | None = None) -> None:
        self._pool = pool
        self._credentials = credentials or ReplicaCredentials({}, {})

    def configure(self, config: Config) -> None:
        """Sources, limits and timeouts from `config`'s models (at start, and after a reload)."""
        self._sources = {(m.name, a): path for m in config.models for a, path in m.adapters.items()}
        self._managed = {m.name: frozenset(m.adapters) for m in config.models}
        self._limits = {m.name: m.max_adapters_per_replica for m in config.models}
        self._timeouts = {m.name: m.adapter_load_timeout_s for m in config.models}

    # -- what the request path asks -------------------------------------------------------------

    def can_load(self, pool: str, adapter: str) -> bool:
        return (pool, adapter) in self._sources

    def timeout_s(self, pool: str) -> float:
        return self._timeouts.get(pool, self._default_timeout)

    def loaded(self, pool: str, adapter: str) -> bool:
        return any(r.healthy and adapter in r.adapters for r in self._fleet.snapshot().pool(pool))

    async def ensure(self, pool: str, adapter: str) -> None:
        """Return once a healthy replica of `pool` lists `adapter`. Raises AdapterLoadFailed, or
        TimeoutError past the pool's `adapter_load_timeout_s`. Cancelling the caller leaves the load."""
        if self.loaded(pool, adapter):
            return
        key = (pool, adapter)
        task = self._loads.get(key)
        if task is None:
            task = self._loads[key] = asyncio.get_running_loop().create_task(self._load(pool, adapter))
            task.add_done_callback(functools.partial(self._done, key))
        async with asyncio.timeout(self.timeout_s(pool)):
            await asyncio.shield(task)

    def start_load(self, pool: str, adapter: str) -> None:
        """Begin loading without waiting (a shadow copy's target: the copy is dropped meanwhile)."""
        if (pool, adapter) in self._loads or not self.can_load(pool, adapter):
            return
        task = asyncio.get_running_loop().create_task(self.ensure(pool, adapter))
        task.add_done_callback(_quiet)

    def dispatched(self, replica: str, adapter: str) -> None:
        key = (replica, adapter)
        self._last_used[key] = self._clock()
        self._busy[key] = self._busy.get(key, 0) + 1

    def finished(self, replica: str, adapter: str) -> None:
        key = (replica, adapter)
        n = self._busy.get(key, 0) - 1
        if n > 0:
            self._busy[key] = n
        else:
            self._busy.pop(key, None)

    async def stop(self) -> None:
        tasks = list(self._loads.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the load -------------------------------------------------------------------------------

    def _done(self, key: tuple[str, str], task: asyncio.Task[str]) -> None:
        if self._loads.get(key) is task:
            del self._loads[key]
        if not task.cancelled() and task.exception() is not None:
            log.warning("adapter %s not loaded: %s", canonical(*key), task.exception())

    async def _load(self, pool: str, adapter: str) -> str:
        target = canonical(pool, adapter)
        async with asyncio.timeout(self.timeout_s(pool)):
            while True:
                if self.loaded(pool, adapter):
                    return "present"
                token = await self._lock(pool, adapter)
                if token is None:  # another gateway is loading it: watch for it
                    await self._refresh_pool(pool)
                    if not self.loaded(pool, adapter):
                        await asyncio.sleep(_WATCH_S)
                    continue
                try:
                    await self._refresh_pool(pool)
                    if self.loaded(pool, adapter):
                        return "present"
                    replica = await self._load_somewhere(pool, adapter, target)
                    log.info("adapter %s loaded on %s", target, replica)
                    return replica
                finally:
                    await self._release(pool, adapter, token)

    async def _load_somewhere(self, pool: str, adapter: str, target: str) -> str:
        path = self._sources.get((pool, adapter))
        if path is None:
            raise AdapterLoadFailed(f"{target}: no source path in models[].adapters")
        reasons = []
        candidates = placement_order(self._fleet.snapshot().pool(pool))
        if not candidates:
            raise AdapterLoadFailed(f"{target}: no healthy replica in pool {pool!r}")
        for r in candidates:
            await self._make_room(r, pool, adapter)
            status, body = await self._call(
                r, "/v1/load_lora_adapter", {"lora_name": adapter, "lora_path": path}
            )
            already = status == 400 and b"already" in body
            if status == 200 or already:
                await self._refresh(r)
                if adapter in (self._fleet.snapshot().by_name(r.name) or r).adapters:
                    self._m.adapter_loads.labels(target, "ok").inc()
                    return r.name
            self._m.adapter_loads.labels(target, "failed").inc()
            reasons.append(f"{r.name}: {status} {body[:200].decode('utf-8', 'replace')}")
        raise AdapterLoadFailed(f"{target}: every replica refused ({'; '.join(reasons)})")

    async def _make_room(self, r: ReplicaState, pool: str, adapter: str) -> None:
        evict = adapters_to_evict(
            r.adapters,
            adapter,
            self._limits.get(pool),
            managed=self._managed.get(pool, frozenset()),
            active=r.active_adapters,
            busy={a for (name, a) in self._busy if name == r.name},
            last_used={a: t for (name, a), t in self._last_used.items() if name == r.name},
        )
        for old in evict:
            status, _ = await self._call(r, "/v1/unload_lora_adapter", {"lora_name": old})
            outcome = "ok" if status == 200 else "failed"
            self._m.adapter_unloads.labels(canonical(pool, old), outcome).inc()
            log.info(
                "adapter %s unloaded from %s (least recently used): %s", canonical(pool, old), r.name, status
            )
        if evict:
            await self._refresh(r)

    async def _call(self, r: ReplicaState, path: str, doc: dict[str, str]) -> tuple[int, bytes]:
        """POST `doc` to the replica; (status, body), status 0 when it could not be reached."""
        assert self._pool is not None, "AdapterLoader.bind() has not run"
        try:
            async with asyncio.timeout(_CALL_S):
                resp = await self._pool.post(
                    r.url, path, orjson.dumps(doc), self._credentials.headers_for(r.name, r.pool)
                )
                body = await resp.read()
                resp.release()
                return resp.status, body
        except Exception as err:  # unreachable, timed out, broken: the replica's failure
            return 0, repr(err).encode()

    async def _refresh(self, r: ReplicaState) -> None:
        """Read the replica's `/v1/models` now and hand it to the fleet picture."""
        assert self._pool is not None
        try:
            async with asyncio.timeout(_CALL_S):
                resp = await self._pool.get(
                    r.url, "/v1/models", self._credentials.headers_for(r.name, r.pool)
                )
                body = await resp.read()
                resp.release()
            if resp.status == 200:
                self._fleet.record_models(r.name, parse_models(body))
        except Exception as err:  # unreachable, timed out, not a model list: the next poll will tell
            log.debug("replica %s: /v1/models after a load failed: %r", r.name, err)

    async def _refresh_pool(self, pool: str) -> None:
        await asyncio.gather(*(self._refresh(r) for r in self._fleet.snapshot().pool(pool) if r.healthy))

    async def _lock(self, pool: str, adapter: str) -> str | None:
        """A token when this gateway may load (always without Redis), None while another holds the
        lock. Redis unreachable: load anyway (a second load of the same adapter is refused by vLLM
        with 400 "already loaded", which counts as loaded)."""
        token = os.urandom(8).hex()
        if self._redis is None:
            return token
        ms = int(self.timeout_s(pool) * 1000)
        try:
            async with asyncio.timeout(1.0):
                got = await self._redis.set(self._lock_key(pool, adapter), token, nx=True, px=ms)
        except Exception as err:
            log.warning("adapter load lock: Redis unreachable (%r); loading without it", err)
            return token
        return token if got else None

    async def _release(self, pool: str, adapter: str, token: str) -> None:
        if self._unlock is None:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self._unlock(keys=[self._lock_key(pool, adapter)], args=[token])

    def _lock_key(self, pool: str, adapter: str) -> str:
        return f"{self._prefix}adapter-load:{{{pool}}}:{adapter}"


def _quiet(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a failed background load is logged by `_done`, not here
