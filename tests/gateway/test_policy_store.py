"""The admin API's changes: the policy store contract on memory and on a real Redis, the registry
built from config + changes (revoked config keys stay revoked, API keys of tenants no longer in the
config are ignored, patches laid over the config), and PolicySync over Redis pub/sub."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.auth_keys import hash_key
from gateway.config import parse_config
from gateway.config_tenancy import KeyLimits, QuotaConfig
from gateway.metrics import GatewayMetrics
from gateway.policy_overrides import KeyRecord, Overrides, TenantPatch
from gateway.policy_store import MemoryPolicyStore, NameTaken, PolicyStore, RedisPolicyStore
from gateway.policy_sync import PolicySync
from gateway.tenants import TenantRegistry
from tests.gateway.redis_server import RedisServer, redis_server  # noqa: F401

CONFIG = parse_config(
    {
        "tenants": [
            {"name": "acme", "api_keys": [hash_key("k-acme")], "limits": {"rpm": 60},
             "keys": [{"name": "ci-bot", "hash": hash_key("k-ci")}]},
            {"name": "globex", "api_keys": [hash_key("k-globex")]},
        ]
    }
)  # fmt: skip


def api_key(tenant: str, name: str, key: str, **kw: Any) -> KeyRecord:
    return KeyRecord(tenant=tenant, name=name, hash=hash_key(key), created_at=1.0, created_by="ops", **kw)


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis_server: RedisServer) -> AsyncIterator[PolicyStore]:  # noqa: F811
    s: PolicyStore = (
        MemoryPolicyStore()
        if request.param == "memory"
        else RedisPolicyStore.from_url(redis_server.url, key_prefix="kvgate:")
    )
    try:
        yield s
    finally:
        await s.close()


async def test_changes_are_stored_with_a_generation_and_names_are_claimed_once(store: PolicyStore) -> None:
    assert (await store.load()) == Overrides()
    svc = api_key("acme", "svc", "k-svc", limits=KeyLimits(rpm=5), quotas=(QuotaConfig(tokens=9, per="day"),))
    assert await store.create_key(svc) == 1
    with pytest.raises(NameTaken):
        await store.create_key(api_key("acme", "svc", "k-other"))
    assert await store.create_key(api_key("globex", "svc", "k-g")) == 2  # names are per tenant
    revoked = svc.model_copy(update={"revoked_at": 5.0, "revoked_by": "ops"})
    assert await store.revoke_key(revoked) == 3
    assert await store.create_key(api_key("acme", "svc", "k-svc2")) == 4  # a revoked name is free again
    patch = TenantPatch(limits={"rpm": 5, "tpm": None}, updated_by="ops")
    assert await store.put_patch("acme", patch) == 5
    ov = await store.load()
    assert ov.generation == 5 == await store.generation()
    assert ov.keys[hash_key("k-svc")] == revoked and ov.tenants == {"acme": patch}
    assert {r.name for r in ov.api_keys_of("acme")} == {"svc"} and ov.revoked(hash_key("k-svc"))
    assert await store.put_patch("acme", None) == 6 and (await store.load()).tenants == {}
    await store.heartbeat("gw1", 6, 100.0)
    assert await store.gateways() == {"gw1": (6, 100.0)}
    await store.forget(["gw1"])
    assert await store.gateways() == {}


def test_the_registry_lays_the_changes_over_the_config() -> None:
    ov = Overrides(
        generation=3,
        keys={
            hash_key("k-ci"): KeyRecord(tenant="acme", name="ci-bot", hash=hash_key("k-ci"), source="config",
                                        revoked_at=2.0, revoked_by="ops"),
            hash_key("k-new"): api_key("acme", "new", "k-new", limits=KeyLimits(rpm=3)),
            hash_key("k-gone"): api_key("initech", "svc", "k-gone"),  # a tenant no longer in the config
        },
        tenants={"acme": TenantPatch(limits={"rpm": 5}, quotas=(QuotaConfig(requests=7, per="week"),))},
    )  # fmt: skip
    reg = TenantRegistry(CONFIG, ov)
    assert reg.by_key("k-ci") is None  # revoked through the API though the config lists it
    new = reg.by_key("k-new")
    assert new is not None and new.key is not None and new.key.source == "api" and new.key.rpm == 3
    assert [b.name for b in new.buckets] == ["requests", "k:new:requests"]
    assert reg.by_key("k-gone") is None
    acme = reg.get("acme")
    assert acme is not None and acme.rpm == 5 and acme.quotas[0].name == "requests-per-week"
    assert acme.quotas[0].source == "api"
    assert {e.principal.key_label for e in reg.keys_of("acme")} == {
        "new",
        "unnamed-" + hash_key("k-acme")[7:15],
    }
    assert reg.get("globex") is not None and reg.get("globex").rpm is None  # type: ignore[union-attr]
    # a stored patch the config can no longer take is ignored, not fatal
    bad = Overrides(tenants={"acme": TenantPatch(limits={"rpm": 0})})
    assert TenantRegistry(CONFIG, bad).get("acme").rpm == 60  # type: ignore[union-attr]


async def test_sync_applies_a_change_published_by_another_gateway_at_once(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    cfg = parse_config({"state": {"store": redis_server.url, "resync_interval_s": 60}})
    applied: dict[str, list[int]] = {"a": [], "b": []}
    syncs = []
    for name in ("a", "b"):
        s = RedisPolicyStore.from_url(redis_server.url, key_prefix="kvgate:")
        note = applied[name].append
        sync = PolicySync(s, lambda ov, note=note: note(ov.generation), cfg.state, GatewayMetrics(), name,
                          channel=s.channel, channel_url=redis_server.url)  # fmt: skip
        syncs.append(sync)
    a, b = syncs
    for s in syncs:
        await s.start()
    try:
        async with asyncio.timeout(5):
            while set(await a.store.gateways()) != {"a", "b"}:  # noqa: ASYNC110  (both started)
                await asyncio.sleep(0.02)
        gen = await a.store.create_key(api_key("acme", "svc", "k-svc"))
        result = await a.propagate(gen)  # resync is a minute away: only pub/sub can bring it to b
        assert result["pending"] == [] and result["confirmed"] == ["a", "b"] and result["gateways"] == 2
        assert applied["b"][-1] == gen == b.generation
    finally:
        for s in syncs:
            await s.stop()


async def test_a_key_write_that_fails_gives_its_name_back(redis_server: RedisServer) -> None:  # noqa: F811
    store = RedisPolicyStore.from_url(redis_server.url, key_prefix="kvgate:")
    real = store._change

    async def fails(write: Any) -> int:
        raise ConnectionError("reset by peer")

    try:
        store._change = fails  # type: ignore[method-assign]
        with pytest.raises(ConnectionError):
            await store.create_key(api_key("acme", "svc", "k1"))
        store._change = real  # type: ignore[method-assign]
        assert await store.create_key(api_key("acme", "svc", "k2")) == 1  # the name was not left claimed
        assert set((await store.load()).keys) == {hash_key("k2")}
    finally:
        await store.close()
