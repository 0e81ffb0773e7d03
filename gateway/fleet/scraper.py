"""Background loops that keep `FleetState` fresh: `/metrics`, `/health` and `/v1/models` of every replica.

Three loops, one asyncio task each. A loop keeps a heap of per-replica due times: replicas start at
evenly spread random phases and each next fetch is due `interval * U(0.9, 1.1)` later, so fetches
(and the gateway's CPU spent on them) spread over the interval instead of landing in lockstep. Each
fetch runs in its own short task bounded by its timeout; a replica whose previous fetch of the same
kind is still pending is skipped for that turn, so one hung replica never delays the others.

The HTTP client is kvgate's own upstream pool (`gateway.upstream.UpstreamPool`, httptools in C), so
a replica URL's TLS and path prefix apply here as to proxied requests (`/vllm/metrics`).
httpx was used first: at a 50 ms cadence one scrape (GET + parse + state update) took ~4-5 ms of CPU
here (2-core machine under load 5-6), most of it httpx's per-request overhead (h11 parses in pure
Python), so sixty-four replicas at 200 ms would have cost ~1.3 cores of the gateway's one.

Outcomes go to the state: a good scrape -> `record_scrape`; a failed scrape or health check ->
`report_failure` with the kind ("connect" ejects at once, see `FleetState.report_failure`); `/health`
answering non-200 -> `record_health(ok=False)`. A failed models poll only keeps the previous list.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any, Protocol
from urllib.parse import urlencode

from gateway.config import FleetConfig
from gateway.fleet.metrics_parse import SAMPLE_NAMES, MetricsParseError, MetricsParser
from gateway.fleet.models_parse import parse_models
from gateway.fleet.state import FleetState
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


@dataclass(frozen=True, slots=True)
class _Loop:
    kind: str
    interval_s: float
    fetch: Callable[[int], Coroutine[Any, Any, None]]


class FleetScraper:
    """Owns the three loops and their fetch tasks; `client` stays the caller's (not closed here).

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
        self._targets = tuple((r.display_name, r.url) for r in state.replicas)
        self._index = {name: i for i, (name, _) in enumerate(self._targets)}
        self._urls = tuple(url for _, url in self._targets)
        creds = credentials or ReplicaCredentials({}, {})
        # vLLM's --api-key guards /v1/models (adapters come from there); sent on every fetch alike.
        self._headers = tuple(creds.headers_for(r.display_name, r.model) for r in state.replicas)
        self._parsers = [MetricsParser() for _ in self._targets]
        self._stats = [ScrapeStats() for _ in self._targets]
        self._loops = (
            _Loop("metrics", fleet.scrape_interval_s, self._scrape),
            _Loop("health", fleet.health_interval_s, self._check_health),
            _Loop("models", fleet.models_poll_interval_s, self._poll_models),
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: dict[tuple[str, int], asyncio.Task[None]] = {}

    async def start(self) -> None:
        if self._tasks:
            raise RuntimeError("FleetScraper already started")
        n = len(self._targets)
        await asyncio.gather(*(self._poll_models(i) for i in range(n)), *(self._scrape(i) for i in range(n)))
        self._tasks = [
            asyncio.create_task(self._run(loop), name=f"kvgate-fleet-{loop.kind}") for loop in self._loops
        ]

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._pending.values()]
        self._tasks = []
        self._pending.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stats(self, replica: str) -> ScrapeStats:
        """A copy of `replica`'s scrape counters (KeyError for an unknown name)."""
        return replace(self._stats[self._index[replica]])

    # -- scheduling -----------------------------------------------------------------------------

    async def _run(self, loop: _Loop) -> None:
        n = len(self._targets)
        if n == 0:
            return
        clock = asyncio.get_running_loop().time
        start = clock()
        due = [(start + loop.interval_s * (i + self._rng.random()) / n, i) for i in range(n)]
        heapq.heapify(due)
        while True:
            at, i = due[0]
            delay = at - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            step = loop.interval_s * self._rng.uniform(1 - _JITTER, 1 + _JITTER)
            heapq.heapreplace(due, (max(at, clock()) + step, i))
            self._launch(loop, i)

    def _launch(self, loop: _Loop, i: int) -> None:
        key = (loop.kind, i)
        if key in self._pending:
            return  # the previous fetch is still within its timeout
        task = asyncio.create_task(loop.fetch(i), name=f"kvgate-fleet-{loop.kind}-{self._targets[i][0]}")
        self._pending[key] = task

        def _done(t: asyncio.Task[None]) -> None:
            if self._pending.get(key) is t:
                del self._pending[key]

        task.add_done_callback(_done)

    async def _get(self, i: int, path: str, timeout_s: float) -> tuple[int, bytes]:
        """(status, body) of `GET path` on replica i, within `timeout_s`. A kept-alive connection the
        replica had just closed is retried by the pool; a dead replica then refuses, and is ejected."""
        async with asyncio.timeout(timeout_s):
            resp = await self._client.get(self._urls[i], path, self._headers[i])
            try:
                body = await resp.read()
            except BaseException:
                resp.close()
                raise
            resp.release()  # read to the end: the connection is kept for the next fetch
            return resp.status, body

    # -- the three fetches (never raise but CancelledError) -------------------------------------

    async def _scrape(self, i: int) -> None:
        name = self._targets[i][0]
        started = time.perf_counter()
        error: str | None = None
        try:
            status, body = await self._get(i, _METRICS_PATH, self._fleet.scrape_timeout_s)
            if status != 200:
                error = f"status_{status // 100}xx"
            else:
                metrics = self._parsers[i].parse(body.decode("utf-8", "replace"))
        except MetricsParseError as err:
            error = "parse"
            log.debug("replica %s: bad /metrics page: %s", name, err)
        except Exception as err:
            error = _failure_kind(err)
            log.debug("replica %s: scrape failed: %r", name, err)
        duration = time.perf_counter() - started
        if error is None:
            self._state.record_scrape(name, metrics)
        else:
            self._state.report_failure(name, error)
        stats = self._stats[i]
        stats.scrapes += 1
        stats.failures += error is not None
        stats.last_duration_s = duration
        stats.last_error = error
        if self._observer is not None:
            try:
                self._observer.scrape_finished(name, duration, error)
            except Exception:
                log.exception("scrape observer failed on %s", name)

    async def _check_health(self, i: int) -> None:
        name = self._targets[i][0]
        try:
            status, _ = await self._get(i, "/health", self._fleet.health_timeout_s)
        except Exception as err:
            log.debug("replica %s: health check failed: %r", name, err)
            self._state.report_failure(name, _failure_kind(err))
            return
        self._state.record_health(name, status == 200)

    async def _poll_models(self, i: int) -> None:
        name = self._targets[i][0]
        try:
            status, body = await self._get(i, "/v1/models", self._fleet.scrape_timeout_s)
            if status != 200:
                raise ValueError(f"status {status}")
            served = parse_models(body)
        except Exception as err:  # ModelsParseError, HTTP status, transport
            log.debug("replica %s: /v1/models poll failed: %r", name, err)
            return
        self._state.record_models(name, served)
