"""uvicorn serving one replica's app on a pre-bound socket, inside the caller's event loop.

Several replicas share one loop (one process is fine). uvicorn's signal handling is switched off: the
owner (the fleet, the CLI) decides when to stop. `stop()` is a hard kill: the listening socket closes and
every open connection is dropped at once, as when a replica process dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from simulator.server.asgi import TRANSPORT_KEY
from simulator.server.replica import Replica

_START_TIMEOUT_S = 10.0
_DRAIN_TIMEOUT_S = 2.0


class ExposingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol that also puts the transport into the ASGI scope's extensions,
    so the crash fault can drop a connection mid-response, and sets TCP_NODELAY on each accepted
    connection (asyncio does not when the listening socket's proto is 0; without it Nagle can hold a
    small write behind the client's delayed ACK, ~40 ms, which is no part of what we simulate)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)  # type: ignore[arg-type]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {TRANSPORT_KEY: self.transport}  # type: ignore[typeddict-unknown-key,dict-item]


class _SignalFreeServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port); port 0 picks a free one. SO_REUSEADDR so a restart can rebind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class ReplicaServer:
    """One replica behind one uvicorn server. `start()` and `stop()` from the loop that serves it."""

    def __init__(self, replica: Replica, sock: socket.socket) -> None:
        self.replica = replica
        self._sock = sock
        host, port = sock.getsockname()[:2]
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        self.port: int = port
        config = uvicorn.Config(
            replica.app, http=ExposingHttpToolsProtocol, ws="none", lifespan="off", log_config=None,
            access_log=False, proxy_headers=False, backlog=4096,
        )
        self._server = _SignalFreeServer(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.replica.start()
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[self._sock]), name=f"kvgate-sim-server-{self.port}")
        async with asyncio.timeout(_START_TIMEOUT_S):
            while not self._server.started:
                if self._task.done():
                    self._task.result()
                    raise RuntimeError(f"simulator server on port {self.port} exited during start-up")
                await asyncio.sleep(0.002)

    async def stop(self) -> None:
        """Hard kill: stop listening, drop every connection, end in-flight handlers, stop the engine."""
        server = self._server
        server.should_exit = server.force_exit = True
        for listener in getattr(server, "servers", []):
            listener.close()
        for connection in list(server.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, SystemExit):
                await self._task
        tasks = list(server.server_state.tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=_DRAIN_TIMEOUT_S)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await self.replica.stop()
        self._sock.close()
