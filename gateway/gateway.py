"""The one Gateway object: everything a request needs, built once, started and stopped together.

Built by the app's lifespan (or by tests and `kvgate up` directly) and passed down explicitly; there
are no module-level singletons. One Gateway per process: its prefix index, in-flight counts and queues
are one picture of the fleet. With `server.workers` > 1 each worker process has its own Gateway and
so its own picture (gateway/worker_group.py says what the workers share and what they do not).
"""

from __future__ import annotations

import logging
import random
import ssl
import time
from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.access_log import AccessLog
from gateway.config import Config, ConfigError
from gateway.config_file import ConfigFile, ConfigWatch
from gateway.config_snapshot import ConfigSnapshot
from gateway.discovery import Discovery
from gateway.drain import Drain
from gateway.fleet.scraper import FleetScraper, build_client
from gateway.fleet.state import FleetChange, FleetState
from gateway.forwarder import Forwarder, Timeouts
from gateway.kv_events.service import KvEvents
from gateway.latency_store import LatencyStore
from gateway.metrics import GatewayMetrics, gauge_family
from gateway.model_routes import ModelRoutes
from gateway.pool_headroom import PoolHeadroomView
from gateway.reload import ConfigReloader, Reconfigurable
from gateway.replica_auth import ReplicaCredentials
from gateway.request_id import RequestIds
from gateway.routing import Router
from gateway.tenancy import Tenancy
from gateway.upstream import UpstreamPool
from gateway.upstream.address import parse_replica_url
from gateway.upstream.tls import client_tls_context
from gateway.worker_group import WorkerGroup
from policies.types import ReplicaPhase

log = logging.getLogger(__name__)


class Gateway:
    def __init__(
        self,
        config: Config,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        wall_clock: Callable[[], float] = time.time,
        config_file: ConfigFile | None = None,
        workers: WorkerGroup | None = None,
    ) -> None:
        # One of several worker processes (gateway/worker_group.py): admin changes and /metrics reach
        # the siblings through it. None: the only process.
        self.workers = workers
        # The config in force: read once per request, replaced whole by a reload (`reloader`).
        self.snapshot = ConfigSnapshot.of(config, generation=1)
        self.clock = clock
        self.rng = rng or random.Random(config.scheduling.seed)
        self.metrics = GatewayMetrics()
        # Read first: an unset variable or unreadable file stops start-up, naming the setting.
        self.credentials = ReplicaCredentials.from_config(config)
        self.fleet = FleetState(config.replicas, config.fleet, clock)
        # The membership API beside the static list: discovery sources, and a reload, go through it.
        self.discovery = Discovery(config.discovery, self.fleet, config.replicas, clock)
        self.router = Router(config, self.rng)
        # Each dispatch's predicted latency against what it got (gateway/latency_store.py).
        self.latency = LatencyStore(self.router.latency, self.metrics)
        # Goodput headroom per pool, computed at scrape time (gateway/pool_headroom.py).
        # vLLM's KV-cache events, where replicas publish them: the exact prefix index (issue #13).
        self.kv_events = KvEvents(config, self.fleet, clock)
        self.router.exact = self.kv_events
        self.tenancy = Tenancy(
            config, self.fleet, self.metrics, clock, wall_clock, latency=self.router.latency
        )
        # Goodput headroom per pool, computed at scrape time (gateway/pool_headroom.py); the requests
        # queued at admission count as load.
        self.headroom = PoolHeadroomView(
            lambda: self.snapshot.config, self.fleet, lambda: self.router.latency, clock, self._queued_in
        )
        self.metrics.add_callback(self.headroom.collect)
        # A/B routing: routes, their runtime weights, adapter placement, shadow copies (issue #12).
        self.model_routes = ModelRoutes(config, self.fleet, self.router, self.metrics, self.rng, clock)
        self.fleet.add_listener(self._on_fleet_change)
        self.metrics.add_callback(self._collect_fleet_gauges)
        self.request_ids = RequestIds()
        self.access_log = AccessLog(config.server.access_log)
        self.metrics.add_callback(self.discovery.collect)
        self.metrics.add_callback(self.kv_events.collect)
        self.drain = Drain()  # SIGTERM: gateway/drain.py
        self.reloader = ConfigReloader(self.snapshot, self.reload_components(), self._publish, config_file)
        self.metrics.add_callback(self.reloader.collect)
        self._watch = (
            None
            if config_file is None
            else ConfigWatch(config_file, lambda: self.snapshot.config.server, self.reloader.reload)
        )
        self._pool: UpstreamPool | None = None
        self._scrape_pool: UpstreamPool | None = None
        self._scraper: FleetScraper | None = None
        self._forwarder: Forwarder | None = None

    @property
    def config(self) -> Config:
        """The config in force (a request reads `snapshot` once instead, and keeps it)."""
        return self.snapshot.config

    @property
    def session_header(self) -> bytes:
        return self.snapshot.session_header

    def reload_components(self) -> list[tuple[str, Reconfigurable]]:
        """What a reload prepares and commits, in this order (gateway/reload.py): credentials before
        discovery's settle, so a replica the new static list brings gets the new pool credential."""
        return [
            ("replica credentials", self.credentials),
            ("tenants", self.tenancy),
            ("scheduling", self.router),
            ("routes", self.model_routes),  # back to the file's weights; runtime overrides dropped
            ("discovery", self.discovery),
            ("kv events", self.kv_events),  # after discovery: its settle reads the new static list
        ]

    def _publish(self, snapshot: ConfigSnapshot) -> None:
        self.snapshot = snapshot

    async def drain_gracefully(self) -> int:
        """The SIGTERM sequence (gateway/drain.py) with the drain settings in force; returns how many
        requests were cut at the drain timeout. The caller then stops the server."""
        server = self.snapshot.config.server
        admission = self.tenancy.admission
        return await self.drain.run(
            server.drain_propagation_s,
            server.drain_timeout_s,
            admission.close if admission is not None else lambda: None,
        )

    @property
    def forwarder(self) -> Forwarder:
        assert self._forwarder is not None, "Gateway.start() has not run"
        return self._forwarder

    async def start(self) -> None:
        up = self.config.upstream
        tls = self._tls_context()
        self._pool = UpstreamPool(
            up.connect_timeout_s, max_idle_per_origin=up.idle_connections_per_replica, tls=tls
        )
        self._forwarder = Forwarder(
            self._pool,
            Timeouts(
                connect_s=up.connect_timeout_s,
                first_byte_s=up.first_byte_timeout_s,
                chunk_s=up.chunk_timeout_s,
                response_s=up.response_timeout_s,
                send_s=self.config.server.send_timeout_s,
            ),
            up.max_retries,
            self.metrics,
            self.fleet.report_failure,
            credentials=self.credentials,
            routable=self.fleet.routable,
        )
        self._scrape_pool = build_client(self.config.fleet, tls)
        self._scraper = FleetScraper(
            self.fleet, self.config.fleet, self._scrape_pool, rng=self.rng, credentials=self.credentials
        )
        await self._scraper.start()
        await self.discovery.start()
        await self.kv_events.start()
        await self.tenancy.start()
        await self.model_routes.start(self._pool, self._forwarder, self.tenancy.admission, self.credentials)
        if self._watch is not None:
            self._watch.start()
        if self.workers is not None:
            await self.workers.start(self)

    async def stop(self) -> None:
        if self.workers is not None:
            await self.workers.stop()
        if self._watch is not None:
            await self._watch.stop()
        await self.model_routes.stop()
        await self.kv_events.stop()
        await self.discovery.stop()
        await self.tenancy.stop()
        if self._scraper is not None:
            await self._scraper.stop()
        if self._scrape_pool is not None:
            self._scrape_pool.close()
        if self._pool is not None:
            self._pool.close()

    def _tls_context(self) -> ssl.SSLContext | None:
        """The TLS context both pools share; None when no replica is https:// (reads the CA file)."""
        up = self.config.upstream
        discovered_tls = self.config.discovery.configured  # a replicas file may name https:// ones
        own_trust = up.tls_ca_file is not None or not up.tls_verify  # for https:// replicas a reload brings
        if not (discovered_tls or own_trust) and not any(
            parse_replica_url(r.url).tls for r in self.config.replicas
        ):
            return None
        if not up.tls_verify:
            log.warning("upstream.tls_verify is false: replica certificates and host names are not checked")
        try:
            return client_tls_context(up.tls_ca_file, up.tls_verify)
        except ValueError as err:
            raise ConfigError(f"upstream.tls_ca_file: {err}") from None

    def ready(self) -> bool:
        """Not draining, at least one replica is in service, healthy and has been scraped, and no
        discovery source is stale (a fleet picture nobody refreshes may be routing to replicas long
        gone)."""
        if self.drain.draining:
            return False
        return not self.discovery.stale_sources() and any(
            r.in_service and r.healthy and r.scraped_at is not None for r in self.fleet.snapshot().replicas
        )

    def _queued_in(self, pool: str) -> int:
        admission = self.tenancy.admission
        return 0 if admission is None else admission.depth_in(pool)

    def _on_fleet_change(self, replica: str, change: FleetChange) -> None:
        if change & (FleetChange.LEFT | FleetChange.RESET):
            # Gone, or a new process at a new address: nothing kvgate sent it is cached there. A
            # replica that is only not ready keeps its entries (a readiness blip costs no cache).
            self.router.forget_replica(replica)
            self.latency.forget(replica)
        if FleetChange.DEPARTED in change and self._forwarder is not None:
            self._forwarder.replica_departed(replica)
        if FleetChange.LEFT in change:
            self.metrics.forget_replica(replica)
            self.credentials.forget(replica)
        elif change & (FleetChange.JOINED | FleetChange.RESET):
            self.credentials.update_replica(replica, self.fleet.spec(replica).config)
        self.router.observe_scrape(self.fleet, replica, change)
        self.tenancy.on_fleet_change(replica, change)

    def _collect_fleet_gauges(self) -> Iterable[Metric]:
        ages = []
        for name in self.fleet.names():
            age = self.fleet.scrape_age_s(name)
            ages.append((name, -1.0 if age is None else age))
        yield gauge_family(
            "kvgate_replica_scrape_age_seconds",
            "Seconds since the replica's last good /metrics scrape (-1 = never).",
            "replica",
            ages,
        )
        yield gauge_family(
            "kvgate_replica_healthy",
            "1 when the replica is in rotation, 0 while ejected.",
            "replica",
            [(r.name, 1.0 if r.healthy else 0.0) for r in self.fleet.snapshot().replicas],
        )
        states = GaugeMetricFamily(
            "kvgate_replica_state",
            "1 for the replica's membership state (ready, not_ready, terminating), 0 for the others.",
            labels=["replica", "state"],
        )
        for r in self.fleet.snapshot().replicas:
            for phase in ReplicaPhase:
                states.add_metric([r.name, phase.value], 1.0 if r.phase is phase else 0.0)
        yield states
        yield gauge_family(
            "kvgate_prefix_index_keys",
            "Block keys the prefix index holds for the replica.",
            "replica",
            self.router.index.replica_sizes().items(),
        )
