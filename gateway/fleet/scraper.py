"""Background loops that keep `FleetState` fresh: `/metrics`, `/health` and `/v1/models` of every replica.

Three loops, one asyncio task each. A loop keeps a heap of per-replica due times: replicas start at
evenly spread random phases (one that joins later, at a random phase of its own) and each next fetch is
due `interval * U(0.9, 1.1)` later, so fetches (and the gateway's CPU spent on them) spread over the
interval instead of landing in lockstep. Each fetch runs in its own short task bounded by its timeout; a
replica whose previous fetch of the same kind is still pending is skipped for that turn, so one hung
replica never delays the others.

The HTTP client is kvgate's own upstream pool (`gateway.upstream.UpstreamPool`, httptools in C), so a
replica URL's TLS and path prefix apply here as to proxied requests (`/vllm/metrics`). httpx was used
first: at a 50 ms cadence one scrape (GET + parse + state update) took ~4-5 ms of CPU here (2-core
machine under load 5-6), most of it httpx's per-request overhead (h11 parses in pure Python), so
sixty-four replicas at 200 ms would have cost ~1.3 cores of the gateway's one.

Outcomes go to the state: a good scrape -> `record_scrape`; a failed scrape or health check ->
`report_failure` with the kind ("connect" ejects at once, see `FleetState.report_failure`); `/health`
answering non-200 -> `record_health(ok=False)`. A failed models poll only keeps the previous list.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import urlencode

from gateway.config import FleetConfig
from gateway.fleet.metrics_parse import SAMPLE_NAMES, MetricsParseError, MetricsParser
from gateway.fleet.models_parse import parse_models
from gateway.fleet.state import FleetChange, FleetState
from gateway.replica_auth import ReplicaCredentials
from gateway.upstream import BrokenError, ConnectError, UpstreamPool

log = logging.getLogger(__name__)

_JITTER = 0.1  # each period is interval * U(1 - _JITTER, 1 + _JITTER)
# prometheus-client's exposition app (which vLLM's API server has mounted at /metrics) honors
# `name[]` and renders only these families, a few KB instead of ~55 KB; a server that ignores the
# query sends the whole page and the parser's prefilter does the same job.
_METRICS_PATH = "/metrics?" + urlencode([("name[]", n) for n in SAMPLE_NAMES])


@dataclass(slots=True)
class ScrapeStats:
    """One replica's `/metrics` scrapes since start. Durations are seconds (HTTP + parse)."""

    scrapes: int = 0
    failures: int = 0
    last_duration_s: float | None = None
    last_error: str | None = None  # failure kind of the last scrape, None when it was good


class ScrapeObserver(Protocol):
    """Optional hook for the gateway's own metrics; called on the event loop after every scrape."""

    def scrape_finished(self, replica: str, duration_s: float, error: str | None) -> None: ...


def build_client(fleet: FleetConfig, tls: ssl.SSLContext | None = None) -> UpstreamPool:
    """The connection pool the scraper uses: its own, so scrapes never queue behind proxied streams.
    `tls`: the context for https:// replicas, the same the proxying pool uses (None: the default)."""
    return UpstreamPool(connect_timeout_s=min(fleet.scrape_timeout_s, fleet.health_timeout_s), tls=tls)


def _failure_kind(err: BaseException) -> str:
    if isinstance(err, ConnectError):
        return "timeout" if err.timed_out else "connect"
    if isinstance(err, TimeoutError):
        return "timeout"
    if isinstance(err, BrokenError):
        return "broken"
    return "error"


@dataclass(slots=True)
class _Target:
    """One replica being polled. A new object (new `generation`) when it joins again or its URL
    changes, so heap entries and fetches of the old one are told apart."""

    name: str
    url: str
    generation: int
    parser: MetricsParser = field(default_factory=MetricsParser)
    stats: ScrapeStats = field(default_factory=ScrapeStats)


@dataclass(slots=True)
class _Loop:
    kind: str
    interval_s: float
    fetch: Callable[[_Target], Coroutine[Any, Any, None]]
    due: list[tuple[float, int, str]] = field(default_factory=list)  # (when, generation, name) heap
    waker: asyncio.Future[None] | None = None  # resolved to wake the loop early (a replica joined)


class FleetScraper:
    """Owns the three loops and their fetch tasks; `client` stays the caller's (not closed here).

    Follows the fleet's membership: a replica that joins (or moves to a new URL) is polled at once
    (`/v1/models` and `/metrics`, so a discovered replica is admitted as soon as its model shows) and
    then on the loops' schedule; one that leaves is dropped and its pending fetches cancelled.

    `start()` first polls every replica's `/v1/models` and `/metrics` once (bounded by the timeouts)
    so the state is populated when it returns, then starts the loops. `stop()` cancels and awaits
    every task it started. Not reentrant: start once, stop once.
    """

    def __init__(
        self,
        state: FleetState,
        fleet: FleetConfig,
        client: UpstreamPool,
        *,
        rng: random.Random | None = None,
        observer: ScrapeObserver | None = None,
        credentials: ReplicaCredentials | None = None,
    ) -> None:
        self._state = state
        self._fleet = fleet
        self._client = client
        self._rng = rng or random.Random()
        self._observer = observer
        self._generations = itertools.count()
        self._targets: dict[str, _Target] = {}
        for name in state.names():
            self._targets[name] = _Target(name, state.spec(name).url, next(self._generations))
        # vLLM's --api-key guards /v1/models (adapters come from there); sent on every fetch alike.
        self._credentials = credentials or ReplicaCredentials({}, {})
        self._loops = (
            _Loop("metrics", fleet.scrape_interval_s, self._scrape),
            _Loop("health", fleet.health_interval_s, self._check_health),
            _Loop("models", fleet.models_poll_interval_s, self._poll_models),
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def start(self) -> None:
        if self._tasks:
            raise RuntimeError("FleetScraper already started")
        targets = list(self._targets.values())
        await asyncio.gather(*(self._poll_models(t) for t in targets), *(self._scrape(t) for t in targets))
        clock = asyncio.get_running_loop().time
        start, n = clock(), len(targets)
        for loop in self._loops:
            # Evenly spread random phases, so fetches do not land in lockstep.
            loop.due = [
                (start + loop.interval_s * (i + self._rng.random()) / n, t.generation, t.name)
                for i, t in enumerate(targets)
            ]
            heapq.heapify(loop.due)
        self._state.add_listener(self._on_fleet_change)
        self._tasks = [
            asyncio.create_task(self._run(loop), name=f"kvgate-fleet-{loop.kind}") for loop in self._loops
        ]

    async def stop(self) -> None:
        if self._tasks:
            self._state.remove_listener(self._on_fleet_change)
        tasks = [*self._tasks, *self._pending.values()]
        self._tasks = []
        self._pending.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stats(self, replica: str) -> ScrapeStats:
        """A copy of `replica`'s scrape counters (KeyError for a name not polled now)."""
        return replace(self._targets[replica].stats)

    # -- membership -----------------------------------------------------------------------------

    def _on_fleet_change(self, replica: str, change: FleetChange) -> None:
        if FleetChange.LEFT in change:
            self._targets.pop(replica, None)
            for loop in self._loops:
                task = self._pending.pop((loop.kind, replica), None)
                if task is not None:
                    task.cancel()
        elif change & (FleetChange.JOINED | FleetChange.RESET):
            target = _Target(replica, self._state.spec(replica).url, next(self._generations))
            self._targets[replica] = target
            now = asyncio.get_running_loop().time()
            for loop in self._loops:
                at = now + loop.interval_s * self._rng.random()
                heapq.heappush(loop.due, (at, target.generation, replica))
                if loop.waker is not None and not loop.waker.done():
                    loop.waker.set_result(None)
            self._launch(self._loops[2], target, force=True)  # models: admits a discovered replica
            self._launch(self._loops[0], target, force=True)  # metrics: routable needs a fresh scrape

    # -- scheduling -----------------------------------------------------------------------------

    async def _run(self, loop: _Loop) -> None:
        aloop = asyncio.get_running_loop()
        clock = aloop.time
        due = loop.due
        while True:
            if not due:
                await self._sleep(loop, None)
                continue
            at, generation, name = due[0]
            target = self._targets.get(name)
            if target is None or target.generation != generation:
                heapq.heappop(due)  # it left, or joined again under a new generation
                continue
            delay = at - clock()
            if delay > 0:
                await self._sleep(loop, at)
                continue  # woken early or on time: look at the heap again
            step = loop.interval_s * self._rng.uniform(1 - _JITTER, 1 + _JITTER)
            heapq.heapreplace(due, (max(at, clock()) + step, generation, name))
            self._launch(loop, target)

    async def _sleep(self, loop: _Loop, until: float | None) -> None:
        """Sleep until the loop time `until` (None: until woken), or until a replica joins."""
        aloop = asyncio.get_running_loop()
        waker = loop.waker = aloop.create_future()
        handle = None if until is None else aloop.call_at(until, _wake, waker)
        try:
            await waker
        finally:
            loop.waker = None
            if handle is not None:
                handle.cancel()

    def _launch(self, loop: _Loop, target: _Target, force: bool = False) -> None:
        key = (loop.kind, target.name)
        previous = self._pending.get(key)
        if previous is not None:
            if not force:
                return  # the previous fetch is still within its timeout
            previous.cancel()  # it was for the old URL
        task = asyncio.create_task(loop.fetch(target), name=f"kvgate-fleet-{loop.kind}-{target.name}")
        self._pending[key] = task

        def _done(t: asyncio.Task[None]) -> None:
            if self._pending.get(key) is t:
                del self._pending[key]

        task.add_done_callback(_done)

    def _current(self, target: _Target) -> bool:
        """The fetch's replica is still polled at that URL (its result may be recorded)."""
        return self._targets.get(target.name) is target

    async def _get(self, t: _Target, path: str, timeout_s: float) -> tuple[int, bytes]:
        """(status, body) of `GET path` on the target, within `timeout_s`. A kept-alive connection the
        replica had just closed is retried by the pool; a dead replica then refuses, and is ejected."""
        async with asyncio.timeout(timeout_s):
            headers = self._credentials.headers_for(t.name, self._state.pool_of_replica(t.name))
            resp = await self._client.get(t.url, path, headers)
            try:
                body = await resp.read()
            except BaseException:
                resp.close()
                raise
            resp.release()  # read to the end: the connection is kept for the next fetch
            return resp.status, body

    # -- the three fetches (never raise but CancelledError) -------------------------------------

    async def _scrape(self, t: _Target) -> None:
        name = t.name
        started = time.perf_counter()
        error: str | None = None
        try:
            status, body = await self._get(t, _METRICS_PATH, self._fleet.scrape_timeout_s)
            if status != 200:
                error = f"status_{status // 100}xx"
            else:
                metrics = t.parser.parse(body.decode("utf-8", "replace"))
        except MetricsParseError as err:
            error = "parse"
            log.debug("replica %s: bad /metrics page: %s", name, err)
        except Exception as err:
            error = _failure_kind(err)
            log.debug("replica %s: scrape failed: %r", name, err)
        duration = time.perf_counter() - started
        if not self._current(t):
            return  # it left, or moved, while this scrape ran
        if error is None:
            self._state.record_scrape(name, metrics)
        else:
            self._state.report_failure(name, error)
        stats = t.stats
        stats.scrapes += 1
        stats.failures += error is not None
        stats.last_duration_s = duration
        stats.last_error = error
        if self._observer is not None:
            try:
                self._observer.scrape_finished(name, duration, error)
            except Exception:
                log.exception("scrape observer failed on %s", name)

    async def _check_health(self, t: _Target) -> None:
        try:
            status, _ = await self._get(t, "/health", self._fleet.health_timeout_s)
        except Exception as err:
            log.debug("replica %s: health check failed: %r", t.name, err)
            if self._current(t):
                self._state.report_failure(t.name, _failure_kind(err))
            return
        if self._current(t):
            self._state.record_health(t.name, status == 200)

    async def _poll_models(self, t: _Target) -> None:
        try:
            status, body = await self._get(t, "/v1/models", self._fleet.scrape_timeout_s)
            if status != 200:
                raise ValueError(f"status {status}")
            served = parse_models(body)
        except Exception as err:  # ModelsParseError, HTTP status, transport
            log.debug("replica %s: /v1/models poll failed: %r", t.name, err)
            return
        if self._current(t):
            self._state.record_models(t.name, served)


def _wake(waker: asyncio.Future[None]) -> None:
    if not waker.done():
        waker.set_result(None)
