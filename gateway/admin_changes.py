"""What the admin API's writes do: create and revoke keys, set a tenant's limits and quotas.

Each change is validated with the config's own classes (a value the config file would refuse is a
400 naming the field), written to the policy store (`gateway/policy_store.py`), applied on this
gateway before the answer, and propagated to the others (`PolicySync.propagate`). Answers carry
`propagation`: the generation written, the live gateways, which confirmed and which did not (yet).

A new key is `sk-kvgate-` + 32 random URL-safe characters (192 bits), returned once; the store
keeps its SHA-256 hash. A revoked key's record stays in the store, so the key stays refused even if
the config still lists it. PATCH is read-modify-write of the tenant's patch: two admins patching
one tenant at the same instant may lose one's fields (the last write wins), never corrupt it.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from gateway.auth_keys import hash_key
from gateway.config import TenantLimits
from gateway.errors import GatewayError
from gateway.policy_overrides import KeyRecord, NewKeyRequest, PatchRequest, TenantPatch
from gateway.policy_store import NameTaken
from gateway.tenant_status import status

if TYPE_CHECKING:
    from gateway.policy_sync import PolicySync
    from gateway.tenancy import Tenancy

_STORE_FAILURES = (RedisError, OSError, TimeoutError)
_UNREACHABLE = GatewayError(503, "The state store is unreachable; nothing was changed. Please try again.")


def validation_error(err: ValidationError, prefix: str = "") -> GatewayError:
    """A 400 naming the first bad field by its dotted path, and every problem in the message."""
    problems = []
    for e in err.errors():
        path = prefix + ".".join(str(p) for p in e["loc"])
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
        problems.append(f"{path or '(body)'}: {msg}")
    first = err.errors()[0]["loc"] if err.errors() else ()
    return GatewayError(400, "; ".join(problems), param=prefix + ".".join(str(p) for p in first) or None)


def _sync(tenancy: Tenancy) -> PolicySync:
    if tenancy.sync is None:
        raise GatewayError(404, "There are no tenants to change.")
    return tenancy.sync


def _config_of(tenancy: Tenancy, name: str) -> Any:
    tc = next((t for t in tenancy.config.tenants if t.name == name), None)
    if tc is None:
        raise GatewayError(
            404, f"No tenant named '{name}' in the config (the API changes tenants, it does not add them)."
        )
    return tc


async def patch_tenant(
    tenancy: Tenancy, name: str, body: dict[str, Any], admin: str
) -> tuple[dict[str, Any], str]:
    sync = _sync(tenancy)
    tc = _config_of(tenancy, name)
    try:
        req = PatchRequest.model_validate(body)
    except ValidationError as err:
        raise validation_error(err) from None
    try:
        current = (await sync.store.load()).tenants.get(name)
    except _STORE_FAILURES:
        raise _UNREACHABLE from None
    limits = dict(current.limits) if current is not None else {}
    quotas = current.quotas if current is not None else None
    for r in req.revert:
        if r == "limits":
            limits = {}
        elif r == "quotas":
            quotas = None
        elif r.startswith("limits.") and r.removeprefix("limits.") in TenantLimits.model_fields:
            limits.pop(r.removeprefix("limits."), None)
        else:
            raise GatewayError(400, f"revert: {r!r} is not limits, quotas or limits.<field>", param="revert")
    limits.update(req.limits or {})
    if req.quotas is not None:
        quotas = req.quotas
    patch = TenantPatch(limits=limits, quotas=quotas, updated_at=tenancy.wall_clock(), updated_by=admin)
    try:
        TenantLimits.model_validate({**tc.limits.model_dump(), **limits})
        patch.apply(tc)
    except ValidationError as err:
        raise validation_error(err, "limits.") from None
    try:
        gen = await sync.store.put_patch(name, None if patch.empty else patch)
    except _STORE_FAILURES:
        raise _UNREACHABLE from None
    propagation = await sync.propagate(gen)
    t = tenancy.find(name)
    assert t is not None
    out = await status(tenancy, t)
    out["propagation"] = propagation
    change = ", ".join(
        [*(f"limits.{k}={v}" for k, v in (req.limits or {}).items())]
        + (["quotas"] if req.quotas is not None else [])
        + [f"revert {r}" for r in req.revert]
    )
    return out, change


async def create_key(tenancy: Tenancy, tenant: str, body: dict[str, Any], admin: str) -> dict[str, Any]:
    sync = _sync(tenancy)
    _config_of(tenancy, tenant)
    try:
        req = NewKeyRequest.model_validate(body)
    except ValidationError as err:
        raise validation_error(err) from None
    if any(
        e.principal.key is not None and e.principal.key.name == req.name
        for e in tenancy.registry.keys_of(tenant)
    ):
        raise GatewayError(
            409,
            f"Tenant '{tenant}' already has a live key named '{req.name}'.",
            param="name",
            code="key_exists",
        )
    key = "sk-kvgate-" + secrets.token_urlsafe(24)
    record = KeyRecord(
        tenant=tenant,
        name=req.name,
        hash=hash_key(key),
        created_at=tenancy.wall_clock(),
        created_by=admin,
        limits=req.limits,
        quotas=req.quotas,
    )
    try:
        gen = await sync.store.create_key(record)
    except NameTaken:
        raise GatewayError(
            409,
            f"Tenant '{tenant}' already has a live key named '{req.name}'.",
            param="name",
            code="key_exists",
        ) from None
    except _STORE_FAILURES:
        raise _UNREACHABLE from None
    propagation = await sync.propagate(gen)
    return {
        "object": "api_key",
        "tenant": tenant,
        "name": req.name,
        "key": key,  # the only time it is shown
        "created_at": record.created_at,
        "created_by": admin,
        "limits": req.limits.model_dump(exclude_none=True),
        "quotas": [q.model_dump(exclude_none=True) for q in req.quotas],
        "propagation": propagation,
    }


async def revoke_key(tenancy: Tenancy, tenant: str, key_name: str, admin: str) -> dict[str, Any]:
    sync = _sync(tenancy)
    reg = tenancy.registry
    key_hash = reg.key_hash(tenant, key_name)
    if key_hash is None:
        raise GatewayError(404, f"Tenant '{tenant}' has no live key named '{key_name}'.")
    now = tenancy.wall_clock()
    existing = reg.overrides.keys.get(key_hash)
    if existing is not None:
        record = existing.model_copy(update={"revoked_at": now, "revoked_by": admin})
    else:
        record = KeyRecord(
            tenant=tenant, name=key_name, hash=key_hash, source="config", revoked_at=now, revoked_by=admin
        )
    try:
        gen = await sync.store.revoke_key(record)
    except _STORE_FAILURES:
        raise _UNREACHABLE from None
    propagation = await sync.propagate(gen)
    return {
        "object": "api_key",
        "tenant": tenant,
        "name": key_name,
        "source": record.source,
        "revoked": True,
        "revoked_at": now,
        "revoked_by": admin,
        "propagation": propagation,
    }
