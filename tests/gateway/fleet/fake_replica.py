"""A loopback HTTP server that plays a vLLM replica's `/metrics`, `/health` and `/v1/models`.

For the scraper tests (what the fleet code reads, nothing more). Everything it answers is a plain
attribute the test changes between requests; `stop()` closes the listener and every connection, as
when a replica process dies, and `start()` again serves on the same port.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
from collections.abc import Generator
from types import TracebackType

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from tests.vllm_fixtures import VLLM_FIXTURES

FIXTURES = VLLM_FIXTURES
LORA_PAGE = (FIXTURES / "metrics_lora_under_load.txt").read_text()
MODELS_BODY = (FIXTURES / "models_with_adapters.json").read_bytes()


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the test owns the process's signals


class FakeReplica:
    def __init__(
        self, metrics_text: str = LORA_PAGE, models_body: bytes = MODELS_BODY, app: ASGIApp | None = None
    ) -> None:
        self.metrics_text = metrics_text
        self.metrics_status = 200
        self.metrics_delay_s = 0.0  # > 0: /metrics answers that late (a hung replica)
        self.health_status = 200
        self.models_body = models_body
        self.hits: collections.Counter[str] = collections.Counter()
        self.port = 0
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._app: ASGIApp = app or Starlette(routes=[
            Route("/metrics", self._metrics),
            Route("/health", self._health),
            Route("/v1/models", self._models),
        ])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self._app, lifespan="off", log_config=None, access_log=False,
                                timeout_graceful_shutdown=0)
        self._server = _QuietServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        async with asyncio.timeout(5):
            while not self._server.started:  # uvicorn offers a flag, not an event
                if self._task.done():
                    self._task.result()
                    raise RuntimeError("the fake replica's server exited during start-up")
                await asyncio.sleep(0.005)

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        self._server.force_exit = True
        await self._task
        self._server = self._task = None

    async def __aenter__(self) -> FakeReplica:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    async def _metrics(self, request: Request) -> Response:
        self.hits["metrics"] += 1
        if self.metrics_delay_s:
            await asyncio.sleep(self.metrics_delay_s)
        return Response(self.metrics_text, self.metrics_status,
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def _health(self, request: Request) -> Response:
        self.hits["health"] += 1
        return Response(b"", self.health_status)

    async def _models(self, request: Request) -> Response:
        self.hits["models"] += 1
        return Response(self.models_body, media_type="application/json")
