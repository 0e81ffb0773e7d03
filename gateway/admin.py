"""Admin routes (`/admin/...`) on the FastAPI part of the app, guarded by `auth.admin_keys`.

    GET /admin/tenants          every tenant: policy, in-flight and queued requests, usage totals
    GET /admin/tenants/{name}   the same for one tenant plus its buckets' levels read from the store
    GET /admin/replicas         every replica: state, source, URL, pool, health, in flight, drained
    POST /admin/replicas/{name}/drain    no new requests for it (terminating); its streams finish
    DELETE /admin/replicas/{name}/drain  undrain: its state follows its source again
    GET /admin/config, POST /admin/reload  the config in force, and reloading it (reload_admin.py)

`Authorization: Bearer <admin key>`. No key or an unknown key: 401; a valid TENANT key: 403 (known,
but not an admin); no admin keys configured at all: 403 (the admin API is off). Errors are in
OpenAI's shape (the app's HTTPException handler). Usage totals (`used`) count what THIS gateway
process settled since it started (`since`, Unix seconds); bucket levels are the shared store's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException

from gateway.auth_keys import bearer_token
from gateway.gateway import Gateway
from gateway.reload_admin import register_reload_admin


def register_admin_routes(api: FastAPI, gateway: Callable[[], Gateway]) -> None:
    """Add the admin routes to `api`; `gateway()` returns the running Gateway (or raises 503)."""

    def guard(request: Request) -> Gateway:
        gw = gateway()
        reg = gw.tenancy.registry
        if not reg.admin_enabled:
            raise HTTPException(403, "The admin API is disabled: no auth.admin_keys are configured.")
        key = bearer_token(request.headers.get("authorization", "").encode("latin-1"))
        if key is None:
            raise HTTPException(401, "You didn't provide an admin key. Send `Authorization: Bearer <key>`.")
        if reg.is_admin(key):
            return gw
        if reg.by_key(key) is not None:
            raise HTTPException(403, "This key is not an admin key.")
        raise HTTPException(401, "Incorrect admin key provided.")

    @api.get("/admin/tenants")
    async def list_tenants(request: Request) -> dict[str, Any]:
        tenancy = guard(request).tenancy
        return {"object": "list", "data": [tenancy.summary(t) for t in tenancy.tenants()]}

    @api.get("/admin/replicas")
    async def list_replicas(request: Request) -> dict[str, Any]:
        gw = guard(request)
        return {"object": "list", "data": [replica_summary(gw, r.name) for r in gw.fleet.snapshot().replicas]}

    @api.post("/admin/replicas/{name}/drain")
    async def drain_replica(name: str, request: Request) -> dict[str, Any]:
        gw = guard(request)
        try:
            gw.fleet.drain(name)
        except KeyError:
            raise HTTPException(404, f"No replica named '{name}'.") from None
        return replica_summary(gw, name)

    @api.delete("/admin/replicas/{name}/drain")
    async def undrain_replica(name: str, request: Request) -> dict[str, Any]:
        gw = guard(request)
        try:
            gw.fleet.undrain(name)
        except KeyError:
            raise HTTPException(404, f"No replica named '{name}'.") from None
        return replica_summary(gw, name)

    @api.get("/admin/tenants/{name}")
    async def get_tenant(name: str, request: Request) -> dict[str, Any]:
        tenancy = guard(request).tenancy
        t = tenancy.find(name)
        if t is None:
            raise HTTPException(404, f"No tenant named '{name}'.")
        return await tenancy.status(t)

    register_reload_admin(api, guard)


def replica_summary(gw: Gateway, name: str) -> dict[str, Any]:
    """One replica as the admin API shows it."""
    fleet = gw.fleet
    spec = fleet.spec(name)
    state = fleet.snapshot().by_name(name)
    assert state is not None
    return {
        "name": name,
        "state": state.phase.value,
        "drained": fleet.drained(name),
        "source": spec.source,
        "url": spec.url,
        "pool": state.pool or None,
        "healthy": state.healthy,
        "scraped": state.scraped_at is not None,
        "in_flight": state.in_flight,
        "labels": dict(state.labels),
    }
