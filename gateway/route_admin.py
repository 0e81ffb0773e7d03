"""Admin routes for A/B routing (`/admin/routes`), behind the same admin-key guard as `/admin/tenants`.

    GET    /admin/routes          every route: weights in force and the file's, buckets per target,
                                  whether a runtime override is active, and per target (primary and
                                  shadow) requests by status, errors, in flight, tokens, TTFT and
                                  duration (count, mean, p50, p90: histogram bucket bounds)
    GET    /admin/routes/{name}   the same for one route
    PUT    /admin/routes/{name}   new weights: {"weights": {target: int, ...},
                                  "tenant_weights": {tenant: {target: int, ...}}}, either key
                                  optional, each split given whole (every target, integers >= 0,
                                  positive sum); applied to new requests only (streams in flight
                                  keep their target), by every gateway sharing the Redis store
    DELETE /admin/routes/{name}   back to the file's weights, everywhere

Errors in OpenAI's shape: 404 unknown route, 400 a body that is not a valid change, 409 when the
route changed concurrently (retry), 503 with Retry-After when the shared store does not answer.
The counts and latencies are this gateway process's since it started.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException

from gateway.gateway import Gateway
from gateway.model_routes import ModelRoutes, OverrideConflict, OverrideError, OverrideStoreUnavailable


def register_route_admin(api: FastAPI, guard: Callable[[Request], Gateway]) -> None:
    """Add the `/admin/routes` routes to `api`; `guard(request)` checks the admin key."""

    def routes_of(request: Request, name: str | None = None) -> ModelRoutes:
        routes = guard(request).model_routes
        if name is not None and name not in routes.table.routes:
            raise HTTPException(404, f"No route named '{name}'.")
        return routes

    @api.get("/admin/routes")
    async def list_routes(request: Request) -> dict[str, Any]:
        routes = routes_of(request)
        return {"object": "list", "data": [routes.view(n) for n in routes.names()]}

    @api.get("/admin/routes/{name}")
    async def get_route(name: str, request: Request) -> dict[str, Any]:
        return routes_of(request, name).view(name)

    @api.put("/admin/routes/{name}")
    async def put_route(name: str, request: Request) -> dict[str, Any]:
        routes = routes_of(request, name)
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as err:
            raise HTTPException(400, f"the body is not valid JSON: {err}") from None
        try:
            return await routes.set_weights(name, body)
        except OverrideError as err:
            raise HTTPException(400, str(err)) from None
        except OverrideConflict:
            raise HTTPException(409, f"Route '{name}' was changed concurrently; read it and retry.") from None
        except OverrideStoreUnavailable as err:
            raise _unavailable(err) from None

    @api.delete("/admin/routes/{name}")
    async def delete_route(name: str, request: Request) -> dict[str, Any]:
        routes = routes_of(request, name)
        try:
            return await routes.clear_weights(name)
        except OverrideStoreUnavailable as err:
            raise _unavailable(err) from None


def _unavailable(err: Exception) -> HTTPException:
    return HTTPException(
        503,
        f"The route store (Redis) did not answer ({err}); nothing was changed.",
        headers={"retry-after": "1"},
    )
