"""Discovery: the configured sources, run as tasks, reporting through one Reconciler into FleetState.

    discovery = Discovery(config.discovery, fleet, static=config.replicas)
    await discovery.start()          # each source's first sync, bounded by FIRST_SYNC_S
    discovery.stale_sources()        # for /ready
    await discovery.reconfigure(new_config.replicas, new_config.discovery)   # a reload
    await discovery.stop()

The static `replicas:` list is applied at once (it is the fleet FleetState was built with). A source
whose first sync does not come within FIRST_SYNC_S leaves kvgate starting anyway, with that source
stale (so not ready) until it syncs: a slow API server must not crash-loop the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.config import Config, ReplicaConfig
from gateway.config_discovery import DiscoveryConfig
from gateway.discovery.file_source import FileSource
from gateway.discovery.reconciler import Reconciler
from gateway.fleet.membership import ReplicaSpec
from gateway.fleet.state import FleetState
from gateway.reload import ReloadStep

log = logging.getLogger(__name__)

FIRST_SYNC_S = 5.0
SOURCE_KINDS = ("file", "kubernetes", "dns")  # also the precedence between them


class Source(Protocol):
    name: str
    synced: asyncio.Event

    async def run(self) -> None: ...


class Discovery:
    """Owns the sources' tasks; one per Gateway, one event loop."""

    def __init__(
        self,
        config: DiscoveryConfig,
        fleet: FleetState,
        static: Sequence[ReplicaConfig] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.reconciler = Reconciler(fleet, _static_specs(static), clock)
        self._sources: dict[str, Source] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def sources(self) -> dict[str, Source]:
        return dict(self._sources)

    async def start(self) -> None:
        """Start every configured source and wait (at most FIRST_SYNC_S) for their first sync."""
        await self._start_sources(self.config, SOURCE_KINDS)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def reconfigure(self, static: Sequence[ReplicaConfig], config: DiscoveryConfig) -> None:
        """Apply a new static list and discovery section (a reload). A source whose settings did not
        change keeps running; a changed one is restarted and its replicas stay until its first new
        sync replaces them; a removed one is stopped and its replicas depart."""
        old = self.config
        self.config = config
        changed = [k for k in SOURCE_KINDS if getattr(old, k) != getattr(config, k)]
        changed += (
            [] if old.slow_start_s == config.slow_start_s else [k for k in SOURCE_KINDS if k not in changed]
        )
        for kind in changed:
            task = self._tasks.pop(kind, None)
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self._sources.pop(kind, None)
            if getattr(config, kind) is None:
                self.reconciler.unregister(kind)
        self.reconciler.set_static(_static_specs(static))
        await self._start_sources(config, changed)

    def prepare(self, old: Config, new: Config) -> ReloadStep:
        """Reload (gateway/reload.py): nothing to swap at once; the settle step applies the new static
        list and discovery section (`reconfigure`). Replicas, their states and drains survive."""

        async def settle() -> None:
            await self.reconfigure(new.replicas, new.discovery)

        return ReloadStep(settle=settle)

    def stale_sources(self) -> list[str]:
        """Sources not in sync for longer than `stale_after_s` (or never)."""
        return self.reconciler.stale(self.config.stale_after_s)

    def status(self) -> list[dict[str, Any]]:
        """Each source's freshness, for /ready and the admin API (JSON-ready)."""
        stale = set(self.stale_sources())
        out: list[dict[str, Any]] = []
        for s in self.reconciler.statuses():
            age = self.reconciler.age_s(s.name)
            out.append(
                {
                    "source": s.name,
                    "stale": s.name in stale,
                    "age_s": None if age is None else round(age, 3),
                    "replicas": len(s.desired),
                    "errors": s.errors,
                    "last_error": s.last_error,
                }
            )
        return out

    def collect(self) -> Iterable[Metric]:
        """Per-source freshness, size and errors, for a scrape-time callback."""
        age = GaugeMetricFamily(
            "kvgate_discovery_age_seconds",
            "Seconds since the discovery source last synced (list, watch event or bookmark, resolution, "
            "file read); -1 = never. /ready fails past discovery.stale_after_s.",
            labels=["source"],
        )
        size = GaugeMetricFamily(
            "kvgate_discovery_replicas", "Replicas the source currently gives.", labels=["source"]
        )
        errors = CounterMetricFamily(
            "kvgate_discovery_errors", "Failed syncs of the source since start.", labels=["source"]
        )
        for status in self.reconciler.statuses():
            a = self.reconciler.age_s(status.name)
            age.add_metric([status.name], -1.0 if a is None else a)
            size.add_metric([status.name], len(status.desired))
            errors.add_metric([status.name], status.errors)
        yield age
        yield size
        yield errors

    async def _start_sources(self, config: DiscoveryConfig, kinds: Iterable[str]) -> None:
        started: list[Source] = []
        for kind in kinds:
            source = self._build(config, kind)
            if source is None:
                continue
            self.reconciler.register(kind)
            self._sources[kind] = source
            self._tasks[kind] = asyncio.create_task(_run(source), name=f"kvgate-discovery-{kind}")
            started.append(source)
        if not started:
            return
        waits = [asyncio.create_task(s.synced.wait()) for s in started]
        _, pending = await asyncio.wait(waits, timeout=FIRST_SYNC_S)
        for task in pending:
            task.cancel()
        for s in started:
            if not s.synced.is_set():
                log.warning(
                    "discovery %s: no first sync within %gs; starting without it", s.name, FIRST_SYNC_S
                )

    def _build(self, config: DiscoveryConfig, kind: str) -> Source | None:
        ramp = config.slow_start_s
        if kind == "file" and config.file is not None:
            return FileSource(config.file, self.reconciler, slow_start_s=ramp)
        # The Kubernetes and DNS clients load only when configured: together they are most of a
        # second of start-up (every `kvgate` command, every gateway process) for a static fleet.
        if kind == "kubernetes" and config.kubernetes is not None:
            from gateway.discovery.kubernetes_source import KubernetesSource

            return KubernetesSource(config.kubernetes, self.reconciler, slow_start_s=ramp)
        if kind == "dns" and config.dns is not None:
            from gateway.discovery.dns_source import DnsSource

            return DnsSource(config.dns, self.reconciler, slow_start_s=ramp)
        return None


def _static_specs(static: Sequence[ReplicaConfig]) -> list[ReplicaSpec]:
    return [ReplicaSpec.from_config(r) for r in static]


async def _run(source: Source) -> None:
    """A source's task: it should never end but by cancellation; if it does, say why."""
    try:
        await source.run()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("discovery %s stopped", source.name)
