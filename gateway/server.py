"""Run kvgate's app under uvicorn: in the caller's event loop (tests, `kvgate up`) or as a process.

The proxy is one process with one event loop (see DESIGN.md: one picture of the fleet per process);
uvloop and httptools when available, no access log (a log line per request is hot-path work).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Generator
from typing import Any

import uvicorn

from gateway.app import KvgateApp
from gateway.config import Config
from gateway.config_file import ConfigFile
from gateway.gateway import Gateway
from gateway.http_protocol import ClientLimits, protocol_class
from gateway.logs import configure as configure_logging


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its owner (several may share one loop)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
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


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def serve_forever(config: Config, host: str, port: int, config_file: ConfigFile | None = None) -> int:
    """Blocking: run kvgate until SIGINT/SIGTERM, then return the exit status (0). `config_file` is
    what the admin API reloads.

    uvicorn shuts down gracefully on either signal and then re-raises it with the previous handlers
    back in place; those handlers turn it into a normal return here, so callers' `finally` blocks run
    (`kvgate up` stops its simulated fleet there).
    """
    loop = "uvloop"
    try:
        import uvloop  # noqa: F401
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        loop = "asyncio"
    configure_logging(config.server)
    server = uvicorn.Server(
        uvicorn_config(
            KvgateApp(config, config_file=config_file), config.server.log_level, loop, host=host, port=port
        )
    )
    previous = signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
