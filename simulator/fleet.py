"""A fleet of simulated vLLM replicas on loopback ports: for tests, `kvgate up`, `kvgate sim` and benchmarks.

In a running event loop (tests)::

    async with SimFleet(replicas=2, profile="tiny") as fleet:
        fleet.urls                      # ["http://127.0.0.1:41234", ...]
        fleet.replica(0).engine.stats   # live engine stats
        fleet.replica(1).set_faults(error_rate=0.5)
        await fleet.stop_replica(0)     # hard kill: listener closed, connections dropped
        await fleet.restart_replica(0)  # a fresh process on the same port (empty cache, zeroed metrics)

With KV-cache events (off unless `kv_events_port` is given), each replica publishes them as vLLM does
(`simulator/kv_events/publisher.py`)::

    async with SimFleet(replicas=2, kv_events_port=0) as fleet:
        fleet.kv_event_endpoints[1].pub     # "tcp://127.0.0.1:45678": connect a SUB socket here
        fleet.kv_event_endpoints[1].replay  # the ROUTER answering replay requests

From synchronous code (its own thread and loop)::

    handle = SimFleet.start_in_thread(replicas=2)
    handle.urls; handle.set_faults(0, hang_after_chunks=3); handle.stop()

All replicas of one fleet share the loop they were started in; their parts must be touched only from it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from simulator.kv_events import DEFAULT_BUFFER_STEPS, DEFAULT_TOPIC, KVEventEndpoints
from simulator.server.faults import FaultConfig
from simulator.server.replica import Replica, ReplicaConfig
from simulator.server.server import ReplicaServer, bind_socket

if TYPE_CHECKING:
    from simulator.kv_events.publisher import KVEventPublisher

T = TypeVar("T")

_KV_REBIND_TIMEOUT_S = 5.0
"""A restarted replica's event ports may still be held by the closed publisher's sockets for a moment."""


class SimFleet:
    """`replicas` simulated replicas of one profile; replica i listens on `base_port + i` (0: free ports).

    Every keyword but `faults` configures each replica alike (see `ReplicaConfig`); `faults` is one
    `FaultConfig` for all or a sequence with one entry (or None) per replica. Replica i seeds its
    error-rate draws with `fault_seed + i`.

    KV-cache events: with `kv_events_port` Q, replica i publishes on `Q + 2i` (PUB) and answers replay
    requests on `Q + 2i + 1` (ROUTER), under `kv_events_topic`, keeping `kv_events_buffer_steps`
    messages for replay (vLLM's defaults: topic "", 10,000). Q = 0 picks free ports. None (the
    default): no events, no sockets. `kv_event_endpoints` says where; a restarted replica keeps its
    ports and starts again at sequence 0.
    """

    def __init__(
        self,
        replicas: int = 1,
        profile: str = "tiny",
        *,
        time_scale: float = 1.0,
        host: str = "127.0.0.1",
        base_port: int = 0,
        block_size: int = 16,
        kv_blocks: int | None = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        max_loras: int = 0,
        adapters: Sequence[str] = (),
        model: str | None = None,
        scheduling_policy: str = "fcfs",
        faults: FaultConfig | Sequence[FaultConfig | None] | None = None,
        fault_seed: int = 0,
        api_key: str | None = None,
        kv_events_port: int | None = None,
        kv_events_topic: str = DEFAULT_TOPIC,
        kv_events_buffer_steps: int = DEFAULT_BUFFER_STEPS,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        if kv_events_port is not None and not 0 <= kv_events_port <= 65536 - 2 * replicas:
            raise ValueError(f"kv_events_port must be 0 (free ports) or leave room for {2 * replicas} "
                             f"ports below 65536, got {kv_events_port}")
        if kv_events_buffer_steps < 1:
            raise ValueError(f"kv_events_buffer_steps must be >= 1, got {kv_events_buffer_steps}")
        if isinstance(faults, FaultConfig) or faults is None:
            per_replica: list[FaultConfig | None] = [faults] * replicas
        else:
            per_replica = list(faults)
            if len(per_replica) != replicas:
                raise ValueError(f"faults has {len(per_replica)} entries for {replicas} replicas")
        base = ReplicaConfig(
            profile=profile, time_scale=time_scale, block_size=block_size, kv_blocks=kv_blocks,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len, enable_prefix_caching=enable_prefix_caching, max_loras=max_loras,
            adapters=tuple(adapters), model=model, scheduling_policy=scheduling_policy, api_key=api_key,
        )
        self._configs = [
            replace(base, faults=f if f is not None else FaultConfig(), fault_seed=fault_seed + i)
            for i, f in enumerate(per_replica)
        ]
        self._host = host
        self._base_port = base_port
        self._servers: list[ReplicaServer] = []
        self._running: list[bool] = []
        self._kv_port = kv_events_port
        self._kv_topic = kv_events_topic
        self._kv_buffer_steps = kv_events_buffer_steps
        self._kv_ports: list[tuple[int, int]] = []  # replica i's (PUB, ROUTER) ports once bound
        self._kv_endpoints: list[KVEventEndpoints] = []

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind every port, then serve; on any failure, stop what started and re-raise."""
        try:
            for i in range(len(self._configs)):
                port = self._base_port + i if self._base_port else 0
                server = await self._make_server(i, port)
                self._servers.append(server)
                self._running.append(False)
                await server.start()
                self._running[i] = True
        except BaseException:
            await self.stop()
            for server, up in zip(self._servers, self._running, strict=True):
                if not up:  # made but not started: its engine task and event sockets
                    await server.replica.stop()
            raise

    async def stop(self) -> None:
        """Stop every running replica (hard), concurrently."""
        running = [s for s, up in zip(self._servers, self._running, strict=True) if up]
        self._running = [False] * len(self._servers)
        await asyncio.gather(*(s.stop() for s in running))

    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    # -- access ----------------------------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        """Base URLs (`http://host:port`), one per replica, stable across stop/restart."""
        return [s.url for s in self._servers]

    @property
    def kv_event_endpoints(self) -> list[KVEventEndpoints]:
        """Each replica's KV-event endpoints (PUB, ROUTER replay), stable across stop/restart; [] when
        events are off."""
        return list(self._kv_endpoints)

    def replica(self, i: int) -> Replica:
        """Replica i's parts: `.engine`, `.stats`, `.faults`, `.set_faults()`, `.metrics`, `.models`."""
        return self._servers[i].replica

    def is_running(self, i: int) -> bool:
        return self._running[i]

    async def stop_replica(self, i: int) -> None:
        """Kill replica i: its port stops accepting, open connections break, in-flight requests abort."""
        if self._running[i]:
            self._running[i] = False
            await self._servers[i].stop()

    async def restart_replica(self, i: int) -> None:
        """Start replica i again on the same port, fresh (as a restarted process: empty cache, new metrics,
        its start-up faults)."""
        await self.stop_replica(i)
        server = await self._make_server(i, self._servers[i].port, restart=True)
        self._servers[i] = server
        await server.start()
        self._running[i] = True

    async def _make_server(self, i: int, port: int, restart: bool = False) -> ReplicaServer:
        """Replica i on `port`, its sockets bound (HTTP, and the event sockets when events are on)."""
        sock = bind_socket(self._host, port)
        publisher = None
        try:
            if self._kv_port is not None:
                publisher = await self._open_publisher(i, restart)
            return ReplicaServer(Replica(self._configs[i], publisher), sock)
        except BaseException:
            sock.close()
            if publisher is not None:
                await publisher.close()
            raise

    async def _open_publisher(self, i: int, restart: bool) -> KVEventPublisher:
        from simulator.kv_events.publisher import KVEventPublisher

        if i < len(self._kv_ports):
            pub_port, replay_port = self._kv_ports[i]
        elif self._kv_port:
            pub_port, replay_port = self._kv_port + 2 * i, self._kv_port + 2 * i + 1
        else:
            pub_port = replay_port = 0
        publisher = await KVEventPublisher.open(
            self._host, pub_port, replay_port, topic=self._kv_topic, buffer_steps=self._kv_buffer_steps,
            rebind_timeout_s=_KV_REBIND_TIMEOUT_S if restart else 0.0,
        )
        if i == len(self._kv_ports):
            self._kv_ports.append((_port_of(publisher.endpoints.pub), _port_of(publisher.endpoints.replay)))
            self._kv_endpoints.append(publisher.endpoints)
        return publisher

    # -- from synchronous code -------------------------------------------------------------------------

    @classmethod
    def start_in_thread(cls, **kwargs: Any) -> FleetThread:
        """Start a fleet (same keywords as `SimFleet`) in a daemon thread with its own loop; returns once
        it serves. Raises what start-up raised."""
        handle = FleetThread(lambda: cls(**kwargs))
        handle.start()
        return handle


def _port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


class FleetThread:
    """A `SimFleet` running in its own thread and event loop (uvloop when available), for sync callers.

    Methods are thread-safe: they hop onto the fleet's loop and wait for the result.
    """

    def __init__(self, make_fleet: Callable[[], SimFleet]) -> None:
        self._make_fleet = make_fleet
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._fleet: SimFleet | None = None
        self._thread = threading.Thread(target=self._main, name="kvgate-sim-fleet", daemon=True)
        self.urls: list[str] = []
        self.kv_event_endpoints: list[KVEventEndpoints] = []

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every replica and the thread. Idempotent."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread.is_alive():
            loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout)

    def set_faults(self, i: int, **changes: Any) -> FaultConfig:
        """Change replica i's faults (fields of `FaultConfig`); returns the new faults."""
        async def apply() -> FaultConfig:
            return self._require_fleet().replica(i).set_faults(**changes)
        return self.call(apply())

    def stop_replica(self, i: int) -> None:
        self.call(self._require_fleet().stop_replica(i))

    def restart_replica(self, i: int) -> None:
        self.call(self._require_fleet().restart_replica(i))

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run `coro` on the fleet's loop and return its result."""
        if self._loop is None:
            coro.close()
            raise RuntimeError("the fleet is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _require_fleet(self) -> SimFleet:
        if self._fleet is None:
            raise RuntimeError("the fleet is not running")
        return self._fleet

    def _main(self) -> None:
        try:
            import uvloop

            factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
        except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
            factory = None
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            fleet = self._make_fleet()
            await fleet.start()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._fleet = fleet
        self.urls = fleet.urls
        self.kv_event_endpoints = fleet.kv_event_endpoints
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            self._fleet = None
            await fleet.stop()
