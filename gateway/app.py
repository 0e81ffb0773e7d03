"""The ASGI app: proxy paths go straight to raw handlers, everything else through FastAPI.

The Gateway is built in the lifespan and handed to the routes explicitly. The FastAPI part (health,
readiness, metrics, models, admin) is off the hot path; its errors are answered in OpenAI's shape too.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from gateway.admin import register_admin_routes
from gateway.asgi_io import Receive, Scope, Send
from gateway.config import Config
from gateway.config_file import ConfigFile
from gateway.errors import error_body
from gateway.gateway import Gateway
from gateway.http_protocol import ConnectionCounts
from gateway.proxy import ProxyEndpoint
from gateway.worker_group import WorkerGroup

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class KvgateApp:
    """Top-level ASGI callable. `gateway` exists between lifespan startup and shutdown."""

    def __init__(
        self,
        config: Config,
        gateway: Gateway | None = None,
        config_file: ConfigFile | None = None,
        workers: WorkerGroup | None = None,
    ) -> None:
        self.config = config
        self._given = gateway
        self._config_file = config_file  # what a reload reads (gateway/reload.py)
        self._workers = workers  # this process is one of several workers (gateway/worker_group.py)
        self.gateway: Gateway | None = None
        self._proxy: dict[str, ProxyEndpoint] = {}
        self._api = self._build_api()
        self.connections = ConnectionCounts()  # filled by the server's protocol, shown in /metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            handler = self._proxy.get(scope["path"])
            if handler is not None:
                await handler(scope, receive, send)
                return
            await self._api(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            await self._api(scope, receive, send)

    async def startup(self) -> Gateway:
        gw = self._given or Gateway(self.config, config_file=self._config_file, workers=self._workers)
        gw.metrics.add_callback(self.connections.collect)
        await gw.start()
        self.gateway = gw
        self._proxy = {
            "/v1/chat/completions": ProxyEndpoint(gw, "chat", "/v1/chat/completions"),
            "/v1/completions": ProxyEndpoint(gw, "completions", "/v1/completions"),
        }
        return gw

    async def shutdown(self) -> None:
        if self.gateway is not None:
            self._proxy = {}
            await self.gateway.stop()
            self.gateway = None

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as err:  # the server must report it and exit, not serve half-built
                    await send({"type": "lifespan.startup.failed", "message": repr(err)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _gw(self) -> Gateway:
        if self.gateway is None:
            raise HTTPException(503, "kvgate is starting or stopping")
        return self.gateway

    def _build_api(self) -> FastAPI:
        api = FastAPI(title="kvgate", docs_url=None, redoc_url=None, openapi_url=None)

        @api.exception_handler(HTTPException)
        async def _http_error(_: Request, exc: HTTPException) -> Response:
            return Response(
                error_body(exc.status_code, str(exc.detail)),
                exc.status_code,
                media_type="application/json",
                headers=exc.headers,
            )

        @api.exception_handler(RequestValidationError)
        async def _invalid(_: Request, exc: RequestValidationError) -> Response:
            return Response(error_body(400, str(exc.errors())), 400, media_type="application/json")

        @api.exception_handler(Exception)
        async def _bug(_: Request, exc: Exception) -> Response:
            # A bug behind an admin or info route: the client gets OpenAI's shape, as on the proxy's
            # path; Starlette re-raises the exception after this, so the server logs its traceback.
            return Response(error_body(500, "internal error in kvgate"), 500, media_type="application/json")

        @api.get("/health")
        async def health() -> dict[str, str]:
            return {"status": "ok"}

        @api.get("/ready")
        async def ready() -> Response:
            gw = self._gw()
            ok = gw.ready()
            body: dict[str, Any] = {
                "ready": ok,
                "replicas": [
                    {
                        "name": r.name,
                        "state": r.phase.value,
                        "healthy": r.healthy,
                        "scraped": r.scraped_at is not None,
                    }
                    for r in gw.fleet.snapshot().replicas
                ],
            }
            if gw.discovery.reconciler.statuses():
                body["discovery"] = gw.discovery.status()
            if gw.drain.draining:
                body["drain"] = gw.drain.phase.value  # 503 from the first moment of a drain
            return JSONResponse(body, status_code=200 if ok else 503)

        @api.get("/metrics")
        async def metrics() -> Response:
            gw = self._gw()
            if gw.workers is not None:  # every worker's, merged (gateway/worker_metrics.py)
                return Response(await gw.workers.scrape(), media_type=PROMETHEUS_TEXT)
            return Response(gw.metrics.render(), media_type=PROMETHEUS_TEXT)

        @api.get("/v1/models")
        async def models() -> dict[str, Any]:
            fm = self._gw().fleet.models()
            created = int(time.time())
            data: list[dict[str, Any]] = [
                {"id": m, "object": "model", "created": created, "owned_by": "kvgate", "parent": None}
                for m in fm.base_models
            ]
            data += [
                {"id": a, "object": "model", "created": created, "owned_by": "kvgate", "parent": base}
                for a, base in fm.adapters.items()
            ]
            data += [  # routes (A/B): a client-facing name kvgate resolves to one of its targets
                {"id": r, "object": "model", "created": created, "owned_by": "kvgate", "parent": None}
                for r in self._gw().model_routes.names()
            ]
            return {"object": "list", "data": data}

        register_admin_routes(api, self._gw)
        return api
