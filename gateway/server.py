"""Run kvgate's app under uvicorn: in the caller's event loop (tests, `kvgate up`) or as a process.

The proxy is one process with one event loop (see DESIGN.md: one picture of the fleet per process);
uvloop and httptools when available, no access log (a log line per request is hot-path work).
With `server.workers` > 1, `kvgate serve` runs several such processes on one port under a
supervising parent (gateway/supervisor.py); each is a `serve_forever` with its worker slot.

As a process (`serve_forever`), kvgate handles its signals itself rather than leaving them to
uvicorn, which would close the listener at once (so `/ready` would be refused instead of answering
503) and stop serving before load balancers have noticed:

- SIGTERM or SIGINT: the drain (gateway/drain.py), then uvicorn is told to exit, which closes the
  listener and the idle keep-alive connections and stops the Gateway; exit status 0.
- a second SIGTERM or SIGINT: exit at once. Requests in flight are ended as at the drain timeout
  (a stream gets its SSE error event), the server waits at most FORCED_SHUTDOWN_S for their
  connections, and the Gateway is stopped; exit status 128 + the signal's number (143 for SIGTERM,
  130 for SIGINT).
- SIGHUP: reload the config file (gateway/reload.py); the outcome is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Coroutine, Generator
from typing import Any

import uvicorn

from gateway.app import KvgateApp
from gateway.config import Config
from gateway.config_file import ConfigFile
from gateway.gateway import Gateway
from gateway.http_protocol import ClientLimits, protocol_class
from gateway.logs import configure as configure_logging
from gateway.worker_group import WorkerGroup, WorkerSlot, die_with_parent

log = logging.getLogger(__name__)

FORCED_SHUTDOWN_S = 1  # after a second SIGTERM: the longest wait for connections to finish


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its owner (several may share one loop)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind_socket(host: str, port: int, *, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """A bound TCP socket. `reuse_port`: one of several workers' listeners on the port (SO_REUSEPORT);
    `listen=False` leaves the listen() to the server, so connections reach it only once it serves."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)
    sock.setblocking(False)
    return sock


def uvicorn_config(
    app: KvgateApp, log_level: str = "warning", loop: str = "none", **kw: Any
) -> uvicorn.Config:
    """uvicorn settings for kvgate serving `app`; its config's `server` section (timeouts, the
    connection cap) reaches the protocol here. `loop="none"` serves in the caller's loop (tests)."""
    server = app.config.server
    return uvicorn.Config(
        app,
        lifespan="on",
        access_log=False,
        log_level=log_level,
        http=protocol_class(ClientLimits.of(server), app.connections),
        ws="none",  # kvgate serves no WebSocket; an upgrade request is answered as plain HTTP
        loop=loop,
        # Typed int by uvicorn, used only in call_later: a float works.
        timeout_keep_alive=server.keep_alive_timeout_s,  # type: ignore[arg-type]
        backlog=2048,
        proxy_headers=False,  # kvgate reads no client address; the middleware is pure hot-path cost
        server_header=False,
        **kw,
    )


class GatewayServer:
    """`async with GatewayServer(config) as srv:` serves kvgate on `srv.url` in the running loop."""

    def __init__(
        self,
        config: Config,
        host: str = "127.0.0.1",
        port: int = 0,
        gateway: Gateway | None = None,
        config_file: ConfigFile | None = None,
    ):
        self.app = KvgateApp(config, gateway, config_file)
        self._host = host
        self._port = port
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None
        self.url = ""

    @property
    def gateway(self) -> Gateway:
        assert self.app.gateway is not None
        return self.app.gateway

    async def __aenter__(self) -> GatewayServer:
        sock = bind_socket(self._host, self._port)
        port = sock.getsockname()[1]
        host = f"[{self._host}]" if ":" in self._host else self._host
        self.url = f"http://{host}:{port}"
        self._server = _QuietServer(uvicorn_config(self.app))
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises the startup error
                raise RuntimeError("kvgate server exited during start-up")
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None and self._task is not None
        self._server.should_exit = True
        await self._task


class _Signals:
    """The process's signal handling (module doc), on the server's event loop."""

    def __init__(self, server: _QuietServer, app: KvgateApp) -> None:
        self._server = server
        self._app = app
        self._tasks: set[asyncio.Task[Any]] = set()
        self._drain: asyncio.Task[Any] | None = None
        self.exit_code = 0

    def stop(self, signum: int) -> None:
        server, gw = self._server, self._app.gateway
        name = signal.Signals(signum).name
        if gw is None:  # still starting: nothing can be in flight
            server.should_exit = True
        elif gw.drain.begin():
            log.warning("%s: draining (send it again to exit at once)", name)
            self._drain = self._spawn(self._drain_then_exit(gw))
        elif self.exit_code == 0:
            log.warning("%s again: exiting at once, ending %d requests in flight", name, gw.drain.in_flight)
            self.exit_code = 128 + signum
            if self._drain is not None:
                self._drain.cancel()
            gw.drain.cut_now(f"{name} twice: exiting at once")
            server.config.timeout_graceful_shutdown = FORCED_SHUTDOWN_S
            server.should_exit = True

    def reload(self) -> None:
        gw = self._app.gateway
        if gw is None:
            log.warning("SIGHUP: kvgate is starting; not reloading")
            return
        self._spawn(gw.reloader.reload("SIGHUP"))

    async def _drain_then_exit(self, gw: Gateway) -> None:
        await gw.drain_gracefully()
        self._server.should_exit = True

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


async def _serve(server: _QuietServer, app: KvgateApp, sockets: list[socket.socket] | None = None) -> int:
    loop = asyncio.get_running_loop()
    signals = _Signals(server, app)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, signals.stop, signum)
    loop.add_signal_handler(signal.SIGHUP, signals.reload)
    try:
        await server.serve(sockets)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(signum)
    return signals.exit_code


def serve_forever(
    config: Config,
    host: str,
    port: int,
    config_file: ConfigFile | None = None,
    slot: WorkerSlot | None = None,
) -> int:
    """Blocking: run kvgate until it has drained after SIGTERM/SIGINT (module doc); return the exit
    status (0 after a drain). Returns rather than exits, so callers' `finally` blocks run (`kvgate up`
    stops its simulated fleet there). `config_file` is what SIGHUP and the admin API reload. `slot`:
    this process is one of several workers (gateway/supervisor.py): it shares the port with its
    siblings (SO_REUSEPORT) and serves the worker channel (gateway/worker_group.py)."""
    loop = "uvloop"
    try:
        import uvloop  # noqa: F401
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        loop = "asyncio"
    configure_logging(config.server)
    if slot is None:
        app = KvgateApp(config, config_file=config_file)
        server = _QuietServer(uvicorn_config(app, config.server.log_level, loop, host=host, port=port))
        sockets = None
    else:
        if not die_with_parent(slot):
            log.error(
                "kvgate worker %d: its supervisor (pid %d) is gone; not starting", slot.index, slot.parent
            )
            return 1
        app = KvgateApp(config, config_file=config_file, workers=WorkerGroup(slot))
        server = _QuietServer(uvicorn_config(app, config.server.log_level, loop))
        sockets = [bind_socket(host, port, reuse_port=True, listen=False)]
    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        return runner.run(_serve(server, app, sockets))
