"""gateway/tenants.py: tenants compiled from config, keys by hash, anonymous and admin access."""

from __future__ import annotations

from typing import Any

from gateway.auth_keys import hash_key
from gateway.config import parse_config
from gateway.tenants import ANONYMOUS, TenantRegistry, compile_tenant
from policies.token_bucket import BucketSpec
from policies.types import Band


def registry(**cfg: Any) -> TenantRegistry:
    return TenantRegistry(parse_config(cfg))


TENANTS = [
    {
        "name": "acme",
        "api_keys": [hash_key("key-a1"), hash_key("key-a2")],
        "limits": {"rpm": 600, "tpm": 200_000, "tpm_burst": 50_000, "max_concurrency": 5},
        "priority": "critical",
        "weight": 2,
        "models": ["llama-3-8b", "llama-3-8b:*"],
    },
    {"name": "free", "api_keys": [hash_key("key-f")], "priority": "sheddable"},
]


def test_no_tenants_means_an_open_gateway_with_an_unlimited_anonymous_tenant() -> None:
    reg = registry()
    assert reg.open and not reg.any_limits
    assert reg.keyless is not None and reg.keyless.name == ANONYMOUS
    assert not reg.keyless.limited and reg.keyless.max_concurrency is None
    assert reg.keyless.models.allows("anything")


def test_keys_map_to_their_tenant_and_nothing_else_does() -> None:
    reg = registry(tenants=TENANTS)
    assert not reg.open and reg.keyless is None
    acme, acme2 = reg.by_key("key-a1"), reg.by_key("key-a2")
    assert acme is not None and acme2 is not None and acme.name == acme2.name == "acme"
    # each key is its own principal (its own ledger label), with the tenant's policy
    assert acme.key_label == "unnamed-" + hash_key("key-a1")[7:15] and acme2.key_label != acme.key_label
    assert acme.buckets == acme2.buckets == reg.get("acme").buckets  # type: ignore[union-attr]
    free = reg.by_key("key-f")
    assert free is not None and free.name == "free" and free.band is Band.SHEDDABLE
    for wrong in ("", "key-a", "key-a1 ", "KEY-A1", hash_key("key-a1")):  # the stored hash is no key
        assert reg.by_key(wrong) is None


def test_anonymous_tenant_serves_keyless_requests_when_configured() -> None:
    reg = registry(tenants=TENANTS, auth={"anonymous_tenant": "free"})
    assert reg.keyless is reg.get("free")


def test_compiled_policy() -> None:
    acme = registry(tenants=TENANTS).get("acme")
    assert acme is not None
    assert acme.band is Band.CRITICAL and acme.weight == 2 and acme.max_concurrency == 5
    assert acme.requests is not None and acme.requests.spec == BucketSpec.per_minute(600)
    assert acme.tokens is not None and acme.tokens.spec == BucketSpec(50_000, 200_000 / 60)
    assert [b.kind for b in acme.buckets] == ["requests", "tokens"]
    assert acme.models.allows("llama-3-8b") and acme.models.allows("llama-3-8b:sql")
    assert not acme.models.allows("mistral-7b")


def test_concurrency_is_split_over_gateways_only_when_limits_are_shared() -> None:
    cfg = parse_config({"tenants": TENANTS[:1]})
    assert compile_tenant(cfg.tenants[0], concurrency_share=1).max_concurrency == 5
    shared = registry(tenants=TENANTS, state={"store": "redis://127.0.0.1:1/0", "gateways": 2})
    assert shared.get("acme").max_concurrency == 3  # type: ignore[union-attr]  # ceil(5 / 2)
    local = registry(tenants=TENANTS, state={"gateways": 2})  # memory: each gateway is alone
    assert local.get("acme").max_concurrency == 5  # type: ignore[union-attr]


def test_admin_keys_are_their_own_set() -> None:
    reg = registry(tenants=TENANTS, auth={"admin_keys": [hash_key("root")]})
    assert reg.admin_enabled and reg.is_admin("root")
    assert not reg.is_admin("key-a1") and not reg.is_admin("") and not reg.is_admin(hash_key("root"))
    assert not registry(tenants=TENANTS).admin_enabled


def test_no_key_material_in_a_tenants_repr() -> None:
    reg = registry(tenants=TENANTS)
    text = repr(reg.get("acme")) + repr(reg.tenants)
    assert "key-a1" not in text and hash_key("key-a1") not in text and "sha256" not in text
