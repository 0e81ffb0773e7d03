"""Keeps this gateway's key table and tenant policy in step with the admin API's changes, on every
gateway sharing the store, without a store call on the request path.

The request path reads an in-process `TenantRegistry` (keys by hash, tenants by name) and nothing
else. This module rebuilds and swaps it (`apply`) whenever the store's generation moves:

- at once when a change is published (Redis pub/sub, `{p}{admin}:changed`): the message is only a
  nudge, the gateway reloads the whole state in one MULTI, so a message can never be misapplied;
- every `state.resync_interval_s` otherwise: the generation is read and, if it differs from the one
  applied (a lost message, a dropped subscription, a Redis restart), the state is reloaded. So a
  change reaches every gateway within the pub/sub delay (milliseconds) normally, and within
  `resync_interval_s` if a message is lost. After each apply, and at each resync, the gateway writes
  a heartbeat with the generation it serves (`{p}{admin}:gateways`).
- the gateway that made a change applies it before answering, then (`propagate`) waits up to
  `state.propagation_timeout_s` until every live gateway (a heartbeat within 3 resync intervals)
  reports that generation, and says which did: a key created or revoked through the API answers
  only once it works (or is refused) on every gateway, or names those that did not confirm.

With `memory://` there is one gateway and a change applies before the API answers.

While the store is unreachable a gateway keeps the last state it applied (and one started during an
outage serves the config alone until the store answers: API keys are unknown to it, and keys revoked
through the API but still in the config are accepted — remove a leaked key from the config too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.config import StateConfig
from gateway.metrics import GatewayMetrics
from gateway.policy_overrides import Overrides
from gateway.policy_store import MemoryPolicyStore, PolicyStore, RedisPolicyStore

log = logging.getLogger(__name__)

_LIVE_INTERVALS = 3  # a gateway counts as alive while its heartbeat is this many resyncs old
_FORGET_INTERVALS = 60  # and is dropped from the heartbeat table after this many
_FAILURES = (RedisError, OSError, TimeoutError)
_LISTEN_WAIT_S = 1.0  # the listener's longest read; how long stop() may wait for it


class PolicySync:
    """One per gateway. `apply(overrides)` swaps the registry; `channel_url` (Redis) subscribes."""

    def __init__(
        self,
        store: PolicyStore,
        apply: Callable[[Overrides], None],
        state: StateConfig,
        metrics: GatewayMetrics,
        gateway_id: str,
        *,
        channel: str | None = None,
        channel_url: str | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._apply = apply
        self._interval = state.resync_interval_s
        self._timeout = state.propagation_timeout_s
        self._m = metrics
        self.gateway_id = gateway_id
        self._channel = channel
        self._channel_url = channel_url
        self._wall = wall_clock
        self.generation: int | None = None  # None: nothing applied from the store yet
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._failing = False
        self._stopping = False

    async def start(self) -> None:
        if not await self.reload("start"):
            log.error(
                "admin API changes could not be loaded from the store; serving the config alone "
                "until it answers"
            )
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._resync_loop()))
        if self._channel is not None and self._channel_url is not None:
            self._tasks.append(loop.create_task(self._listen_loop()))

    async def stop(self) -> None:
        # A read inside redis-py's PubSub can absorb a cancellation (seen here: the task stayed
        # "cancelling" in get_message); the listener also stops on this flag, which it checks each
        # time its read returns (at least once a second), so stop() never waits longer than that.
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=_LISTEN_WAIT_S * 2)
            if late:
                log.warning("admin API sync: %d task(s) did not stop in time", len(late))
        self._tasks = []
        await self.store.close()

    async def reload(self, reason: str) -> bool:
        """Read the store's state and apply it if its generation is not the one applied."""
        async with self._lock:
            try:
                ov = await self.store.load()
            except _FAILURES as err:
                self._fail(err)
                return False
            if ov.generation != self.generation:
                self._apply(ov)
                self.generation = ov.generation
                self._m.policy_syncs.labels(reason).inc()
            await self._heartbeat()
            return True

    async def _heartbeat(self) -> None:
        assert self.generation is not None
        try:
            await self.store.heartbeat(self.gateway_id, self.generation, self._wall())
        except _FAILURES as err:
            self._fail(err)
            return
        if self._failing:
            log.warning("admin API changes: the store answers again")
        self._failing = False

    def _fail(self, err: BaseException) -> None:
        if not self._failing:
            log.warning("admin API changes: the store is unreachable (%s: %s)", type(err).__name__, err)
        self._failing = True

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                gen = await self.store.generation()
            except _FAILURES as err:
                self._fail(err)
                continue
            if gen != self.generation:
                await self.reload("resync")
            else:
                async with self._lock:
                    await self._heartbeat()

    async def _listen_loop(self) -> None:
        assert self._channel is not None and self._channel_url is not None
        backoff = 0.1
        while not self._stopping:
            client = aioredis.Redis.from_url(self._channel_url, socket_connect_timeout=2.0)
            try:
                async with client.pubsub() as sub:
                    await sub.subscribe(self._channel)
                    await self.reload("message")  # whatever was published while not subscribed
                    backoff = 0.1
                    while not self._stopping:
                        msg = await sub.get_message(ignore_subscribe_messages=True, timeout=_LISTEN_WAIT_S)
                        if msg is not None and not self._stopping:
                            await self.reload("message")
                    return
            except _FAILURES:
                await asyncio.sleep(backoff)  # the resync loop still runs meanwhile
                backoff = min(backoff * 2, self._interval)
            finally:
                await client.aclose()

    async def propagate(self, generation: int) -> dict[str, Any]:
        """After this gateway wrote `generation`: apply it here, then wait for the other gateways."""
        await self.reload("change")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        while True:
            try:
                beats = await self.store.gateways()
            except _FAILURES as err:
                self._fail(err)
                beats = {}
            now = self._wall()
            live = {g: gen for g, (gen, at) in beats.items() if now - at <= _LIVE_INTERVALS * self._interval}
            pending = sorted(g for g, gen in live.items() if gen < generation)
            if not pending or loop.time() >= deadline:
                gone = [g for g, (_, at) in beats.items() if now - at > _FORGET_INTERVALS * self._interval]
                with contextlib.suppress(*_FAILURES):
                    await self.store.forget(gone)
                return {
                    "generation": generation,
                    "gateways": len(live),
                    "confirmed": sorted(g for g in live if g not in pending),
                    "pending": pending,
                }
            await asyncio.sleep(0.02)


def build_policy_sync(
    state: StateConfig,
    apply: Callable[[Overrides], None],
    metrics: GatewayMetrics,
    gateway_id: str,
    wall_clock: Callable[[], float] = time.time,
) -> PolicySync:
    """The sync for `state.store`: in process for memory, the store's hashes and channel for Redis."""
    if state.store == "memory://":
        return PolicySync(MemoryPolicyStore(), apply, state, metrics, gateway_id, wall_clock=wall_clock)
    store = RedisPolicyStore.from_url(state.store, key_prefix=state.key_prefix)
    return PolicySync(
        store,
        apply,
        state,
        metrics,
        gateway_id,
        channel=store.channel,
        channel_url=state.store,
        wall_clock=wall_clock,
    )
