"""Admin routes (`/admin/...`) on the FastAPI part of the app, guarded by `auth.admin_keys`.

    GET    /admin/tenants                    every tenant: policy, in-flight and queued, usage totals
    GET    /admin/tenants/{name}             the same plus its buckets, every quota's use and reset
                                             time, its keys, and what the admin API changed
    PATCH  /admin/tenants/{name}             set limits and quotas (kept in the store, on every gateway)
    GET    /admin/tenants/{name}/keys        its live keys (names and sources, never hashes)
    POST   /admin/tenants/{name}/keys        a new named key: returned ONCE, only its hash is kept
    DELETE /admin/tenants/{name}/keys/{key}  revoke a key (config or API) on every gateway
    GET    /admin/usage                      the usage ledger (gateway/usage_report.py)
    GET    /admin/replicas                   every replica: state, source, URL, pool, health, in flight
    POST   /admin/replicas/{name}/drain      no new requests for it (terminating); its streams finish
    DELETE /admin/replicas/{name}/drain      undrain: its state follows its source again
                                             (both on every worker process of this kvgate)
    GET    /admin/pools                      every pool: goodput headroom (requests/s, tokens/s) under the
                                             headroom SLOs, with each replica's capacity and load
    GET    /admin/routes[/{name}]            A/B routes: weights, buckets, live counts, latency per arm
    PUT    /admin/routes/{name}              runtime weights (every gateway); DELETE: back to the file's
    GET    /admin/config, POST /admin/reload  the config in force, and reloading it (reload_admin.py)

`Authorization: Bearer <admin key>`. No key or an unknown key: 401; a valid TENANT key: 403 (known,
but not an admin); no admin keys configured at all: 403 (the admin API is off). Errors are in
OpenAI's shape. Every admin call is logged (logger `kvgate.admin`, one line: which admin key by
name, method, path, status, what changed) and counted (`kvgate_admin_calls_total`), refused ones
included. Changes answer once every live gateway applied them, or say which did not
(`propagation`, see gateway/policy_sync.py). With several worker processes (`server.workers`),
every answer to /admin/... names the worker that gave it in `x-kvgate-worker`; a drain, an undrain
and a reload are applied by every worker before the answer, and `workers` says which confirmed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from gateway import admin_changes, tenant_status
from gateway.auth_keys import bearer_token
from gateway.errors import GatewayError
from gateway.gateway import Gateway
from gateway.reload_admin import register_reload_admin
from gateway.route_admin import register_route_admin
from gateway.tenancy import Tenancy
from gateway.usage_report import BadQuery, group, parse_query, to_csv, totals
from policies.quota_window import iso_local

audit = logging.getLogger("kvgate.admin")
_REFUSED = "-"


def register_admin_routes(api: FastAPI, gateway: Callable[[], Gateway]) -> None:
    """Add the admin routes to `api`; `gateway()` returns the running Gateway (or raises 503)."""

    @api.exception_handler(GatewayError)
    async def _gateway_error(_: Request, exc: GatewayError) -> Response:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in exc.headers}
        return Response(exc.body(), exc.status, media_type="application/json", headers=headers)

    @api.middleware("http")
    async def _audit(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if not request.url.path.startswith("/admin"):
            return await call_next(request)
        request.state.admin = _REFUSED
        request.state.change = ""
        response = await call_next(request)
        who = request.state.admin
        with contextlib.suppress(HTTPException):
            workers = gateway().workers
            if workers is not None and who != _REFUSED:  # which worker answered, told to admins only
                response.headers["x-kvgate-worker"] = str(workers.index)
        change = f" ({request.state.change})" if request.state.change else ""
        audit.info(
            "admin call by %s: %s %s -> %d%s",
            who,
            request.method,
            request.url.path,
            response.status_code,
            change,
        )
        with contextlib.suppress(HTTPException):
            gateway().metrics.admin_calls.labels(who, request.method, str(response.status_code)).inc()
        return response

    def guard(request: Request) -> Tenancy:
        gw = gateway()
        reg = gw.tenancy.registry
        if not reg.admin_enabled:
            raise HTTPException(403, "The admin API is disabled: no auth.admin_keys are configured.")
        key = bearer_token(request.headers.get("authorization", "").encode("latin-1"))
        if key is None:
            raise HTTPException(401, "You didn't provide an admin key. Send `Authorization: Bearer <key>`.")
        name = reg.admin_name(key)
        if name is not None:
            request.state.admin = name
            return gw.tenancy
        if reg.by_key(key) is not None:
            raise HTTPException(403, "This key is not an admin key.")
        raise HTTPException(401, "Incorrect admin key provided.")

    def tenant_of(tenancy: Tenancy, name: str) -> Any:
        t = tenancy.find(name)
        if t is None:
            raise HTTPException(404, f"No tenant named '{name}'.")
        return t

    @api.get("/admin/tenants")
    async def list_tenants(request: Request) -> dict[str, Any]:
        tenancy = guard(request)
        return {"object": "list", "data": [tenant_status.summary(tenancy, t) for t in tenancy.tenants()]}

    @api.get("/admin/tenants/{name}")
    async def get_tenant(name: str, request: Request) -> dict[str, Any]:
        tenancy = guard(request)
        return await tenant_status.status(tenancy, tenant_of(tenancy, name))

    @api.patch("/admin/tenants/{name}")
    async def patch_tenant(name: str, request: Request) -> dict[str, Any]:
        tenancy = guard(request)
        tenant_of(tenancy, name)
        body = await _json(request)
        out, change = await admin_changes.patch_tenant(tenancy, name, body, request.state.admin)
        request.state.change = change
        return out

    @api.get("/admin/tenants/{name}/keys")
    async def list_keys(name: str, request: Request) -> dict[str, Any]:
        tenancy = guard(request)
        tenant_of(tenancy, name)
        keys = tenancy.registry.keys_of(name)
        return {"object": "list", "data": [tenant_status.key_view(e) for e in keys]}

    @api.post("/admin/tenants/{name}/keys", status_code=201)
    async def create_key(name: str, request: Request) -> dict[str, Any]:
        tenancy = guard(request)
        tenant_of(tenancy, name)
        body = await _json(request)
        out = await admin_changes.create_key(tenancy, name, body, request.state.admin)
        request.state.change = f"key '{out['name']}' created"
        return out

    @api.delete("/admin/tenants/{name}/keys/{key_name}")
    async def revoke_key(name: str, key_name: str, request: Request) -> dict[str, Any]:
        tenancy = guard(request)
        tenant_of(tenancy, name)
        out = await admin_changes.revoke_key(tenancy, name, key_name, request.state.admin)
        request.state.change = f"key '{key_name}' revoked"
        return out

    @api.get("/admin/replicas")
    async def list_replicas(request: Request) -> dict[str, Any]:
        guard(request)
        gw = gateway()
        return {"object": "list", "data": [replica_summary(gw, r.name) for r in gw.fleet.snapshot().replicas]}

    @api.get("/admin/pools")
    async def list_pools(request: Request) -> dict[str, Any]:
        guard(request)
        return {"object": "list", "data": gateway().headroom.summary()}

    @api.post("/admin/replicas/{name}/drain")
    async def drain_replica(name: str, request: Request) -> dict[str, Any]:
        guard(request)
        gw = gateway()
        try:
            gw.fleet.drain(name)
        except KeyError:
            raise HTTPException(404, f"No replica named '{name}'.") from None
        request.state.change = f"replica '{name}' drained"
        return await _on_every_worker(gw, name, True)

    @api.delete("/admin/replicas/{name}/drain")
    async def undrain_replica(name: str, request: Request) -> dict[str, Any]:
        guard(request)
        gw = gateway()
        try:
            gw.fleet.undrain(name)
        except KeyError:
            raise HTTPException(404, f"No replica named '{name}'.") from None
        request.state.change = f"replica '{name}' undrained"
        return await _on_every_worker(gw, name, False)

    @api.get("/admin/usage", response_model=None)
    async def usage(request: Request) -> Response | dict[str, Any]:
        tenancy = guard(request)
        ledger = tenancy.ledger
        if ledger is None:
            raise HTTPException(404, "The usage ledger is off (no tenants, or ledger.enabled: false).")
        known = [t.name for t in tenancy.registry.tenants]
        try:
            q = parse_query(
                dict(request.query_params), known, tenancy.wall_clock(), request.headers.get("accept", "")
            )
        except BadQuery as err:
            raise GatewayError(400, str(err), param=err.param) from None
        await ledger.flush()  # this gateway's latest usage too
        rows = []
        try:
            for tenant in q.tenants:
                rows += [(tenant, *r) for r in await ledger.read(tenant, q.start, q.end)]
        except Exception as err:  # the store's failure, whatever its kind
            raise GatewayError(
                503, f"The usage ledger cannot be read right now ({type(err).__name__})."
            ) from None
        data = group(q, rows)
        if q.csv:
            return Response(to_csv(q, data), media_type="text/csv; charset=utf-8")
        return {
            "object": "usage",
            "from": iso_local(q.start, q.tz),
            "to": iso_local(q.end, q.tz),
            "timezone": q.tz.key,
            "group_by": q.group_by,
            "data": data,
            "totals": totals(data),
        }

    def admin_gateway(request: Request) -> Gateway:
        guard(request)
        return gateway()

    register_route_admin(api, admin_gateway)  # /admin/routes (A/B routing, gateway/route_admin.py)
    register_reload_admin(api, admin_gateway)  # /admin/config, /admin/reload (gateway/reload_admin.py)


async def _on_every_worker(gw: Gateway, name: str, drained: bool) -> dict[str, Any]:
    """The replica as this worker shows it after a drain or undrain, which the other workers (if
    any) apply too before the answer: `workers` says which did (gateway/worker_group.py)."""
    out = replica_summary(gw, name)
    if gw.workers is not None:
        out["workers"] = await gw.workers.confirm("drain", {"replica": name, "drained": drained})
    return out


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


async def _json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise GatewayError(400, "The body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "The body must be a JSON object.")
    return body
