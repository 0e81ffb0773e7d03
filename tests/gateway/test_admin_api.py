"""The admin API's writes over real HTTP on one gateway (memory store): keys created work at once and
revoked ones fail at once, PATCH changes limits and quotas and shows them as the API's, every input
gets a correct answer or an OpenAI-shaped error naming the field, and every call is logged by name."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from gateway.auth_keys import hash_key
from tests.gateway.stack import chat
from tests.gateway.tenancy_stack import ADMIN_KEY, auth, tenancy_stack, tenant

OPS_KEY = "sk-admin-ops"
ADMINS = {"auth": {"admin_keys": [hash_key(ADMIN_KEY), {"name": "ops", "hash": hash_key(OPS_KEY)}]}}
OPS = {"authorization": f"Bearer {OPS_KEY}"}
ANON_ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
CFG = {
    "tenants": [
        tenant("acme", limits={"rpm": 600}, keys=[{"name": "ci-bot", "hash": hash_key("sk-ci")}]),
        tenant("globex"),
    ],
    **ADMINS,
}


def error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return dict(err)


async def ask(c: httpx.AsyncClient, key: str) -> int:
    r = await c.post("/v1/chat/completions", json=chat("hi"), headers={"authorization": f"Bearer {key}"})
    return r.status_code


async def test_a_created_key_works_at_once_and_a_revoked_one_fails_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kvgate.admin")
    async with tenancy_stack(CFG) as s:
        c = s.client
        r = await c.post(
            "/admin/tenants/acme/keys",
            json={"name": "svc", "limits": {"rpm": 5}, "quotas": [{"requests": 3, "per": "day"}]},
            headers=OPS,
        )
        assert r.status_code == 201, r.text
        made = r.json()
        key = made["key"]
        assert key.startswith("sk-kvgate-") and len(key) >= 40 and made["created_by"] == "ops"
        assert made["propagation"]["pending"] == [] and made["propagation"]["gateways"] == 1
        assert await ask(c, key) == 200  # at once
        r = await c.post("/v1/chat/completions", json=chat("hi"), headers={"authorization": f"Bearer {key}"})
        assert r.headers["x-ratelimit-limit-requests"] == "5"  # the key's own limit is the tighter
        listed = (await c.get("/admin/tenants/acme/keys", headers=OPS)).json()["data"]
        assert {k["name"]: k["source"] for k in listed} == {
            "ci-bot": "config",
            "svc": "api",
            "unnamed-" + hash_key("sk-test-acme")[7:15]: "config",
        }
        assert key not in str(listed) and hash_key(key) not in str(listed)
        # the name is taken while the key lives
        error(await c.post("/admin/tenants/acme/keys", json={"name": "svc"}, headers=OPS), 409)
        r = await c.delete("/admin/tenants/acme/keys/svc", headers=OPS)
        assert r.status_code == 200 and r.json()["revoked"] and r.json()["revoked_by"] == "ops"
        assert await ask(c, key) == 401  # at once
        error(await c.delete("/admin/tenants/acme/keys/svc", headers=OPS), 404)  # no live key by that name
        # a key from the config can be revoked too (a leaked one), and stays revoked
        assert await ask(c, "sk-ci") == 200
        assert (await c.delete("/admin/tenants/acme/keys/ci-bot", headers=ANON_ADMIN)).status_code == 200
        assert await ask(c, "sk-ci") == 401
        # a revoked name may be given to a new key (rotation): the ledger continues under it
        r = await c.post("/admin/tenants/acme/keys", json={"name": "svc"}, headers=OPS)
        assert r.status_code == 201 and await ask(c, r.json()["key"]) == 200
        assert await ask(c, key) == 401
    lines = [m for m in caplog.messages if m.startswith("admin call")]
    assert "admin call by ops: POST /admin/tenants/acme/keys -> 201 (key 'svc' created)" in lines
    assert "admin call by ops: DELETE /admin/tenants/acme/keys/svc -> 200 (key 'svc' revoked)" in lines
    unnamed = "unnamed-" + hash_key(ADMIN_KEY)[7:15]
    assert (
        f"admin call by {unnamed}: DELETE /admin/tenants/acme/keys/ci-bot -> 200 (key 'ci-bot' revoked)"
        in lines
    )
    assert all(key not in m and OPS_KEY not in m for m in caplog.messages)


async def test_patch_changes_limits_and_quotas_at_once_and_shows_them_as_the_apis() -> None:
    async with tenancy_stack(CFG) as s:
        c = s.client
        r = await c.patch(
            "/admin/tenants/acme",
            json={"limits": {"rpm": 2, "rpm_burst": 2}, "quotas": [{"requests": 100, "per": "month"}]},
            headers=OPS,
        )
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["limits"]["rpm"] == 2 and out["overrides"]["limits"] == {"rpm": 2, "rpm_burst": 2}
        assert out["overrides"]["updated_by"] == "ops"
        assert out["quotas"][0]["source"] == "api" and out["quotas"][0]["requests"] == 100
        statuses = [
            (await c.post("/v1/chat/completions", json=chat("x"), headers=auth("acme"))).status_code
            for _ in range(3)
        ]
        assert statuses == [200, 200, 429]
        # one field back to the config's value; the quota stays
        r = await c.patch(
            "/admin/tenants/acme", json={"revert": ["limits.rpm_burst", "limits.rpm"]}, headers=OPS
        )
        assert r.json()["limits"]["rpm"] == 600 and r.json()["overrides"]["limits"] == {}
        assert r.json()["quotas"][0]["source"] == "api"
        r = await c.patch("/admin/tenants/acme", json={"revert": ["quotas"]}, headers=OPS)
        assert r.json()["overrides"] is None and r.json()["quotas"] == []
        # other tenants are untouched
        g = (await c.get("/admin/tenants/globex", headers=OPS)).json()
        assert g["overrides"] is None and g["limits"]["rpm"] is None


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "param", "text"),
    [
        (
            "PATCH",
            "/admin/tenants/acme",
            {"limits": {"rpm": 0}},
            400,
            "limits.rpm",
            "greater than or equal to 1",
        ),
        ("PATCH", "/admin/tenants/acme", {"limits": {"rpn": 5}}, 400, "limits.rpn", "unknown key"),
        (
            "PATCH",
            "/admin/tenants/acme",
            {"limits": {"max_output_tokens": None}},
            400,
            "limits.max_output_tokens",
            "",
        ),
        (
            "PATCH",
            "/admin/tenants/acme",
            {"quotas": [{"tokens": 5, "per": "year"}]},
            400,
            "quotas.0.per",
            "'day'",
        ),
        (
            "PATCH",
            "/admin/tenants/acme",
            {"quotas": [{"tokens": 5, "per": "day", "timezone": "Mars/Base"}]},
            400,
            "quotas.0.timezone",
            "unknown time zone",
        ),
        (
            "PATCH",
            "/admin/tenants/acme",
            {"quotas": [{"tokens": 5, "requests": 5, "per": "day"}]},
            400,
            "quotas.0",
            "exactly one",
        ),
        (
            "PATCH",
            "/admin/tenants/acme",
            {"quotas": [{"tokens": 5, "per": "day", "warn_at": 2}]},
            400,
            "quotas.0.warn_at",
            "less than 1",
        ),
        ("PATCH", "/admin/tenants/acme", {"revert": ["limits.nope"]}, 400, "revert", "limits.<field>"),
        ("PATCH", "/admin/tenants/acme", {"colour": "red"}, 400, "colour", "unknown key"),
        ("PATCH", "/admin/tenants/acme", [1, 2], 400, None, "JSON object"),
        ("PATCH", "/admin/tenants/nobody", {"limits": {"rpm": 5}}, 404, None, "nobody"),
        ("POST", "/admin/tenants/acme/keys", {}, 400, "name", "Field required"),
        ("POST", "/admin/tenants/acme/keys", {"name": "a b"}, 400, "name", "pattern"),
        ("POST", "/admin/tenants/acme/keys", {"name": "x", "limits": {"rpm": -1}}, 400, "limits.rpm", ""),
        ("POST", "/admin/tenants/acme/keys", {"name": "ci-bot"}, 409, "name", "already has a live key"),
        ("POST", "/admin/tenants/nobody/keys", {"name": "x"}, 404, None, "nobody"),
        ("DELETE", "/admin/tenants/acme/keys/nope", None, 404, None, "no live key named 'nope'"),
        (
            "DELETE",
            "/admin/tenants/globex/keys/ci-bot",
            None,
            404,
            None,
            "no live key",
        ),  # another tenant's key
    ],
)
async def test_bad_admin_input_is_an_openai_error_naming_the_field(
    method: str, path: str, body: Any, status: int, param: str | None, text: str
) -> None:
    async with tenancy_stack(CFG) as s:
        r = await s.client.request(method, path, json=body, headers=OPS)
        err = error(r, status)
        assert err["param"] == param and text in err["message"]
        # nothing was changed, and acme's key still works
        assert (await s.client.get("/admin/tenants/acme", headers=OPS)).json()["overrides"] is None
        assert await ask(s.client, "sk-ci") == 200


async def test_only_admins_may_write() -> None:
    async with tenancy_stack(CFG) as s:
        c = s.client
        for method, path in (
            ("POST", "/admin/tenants/acme/keys"),
            ("PATCH", "/admin/tenants/acme"),
            ("DELETE", "/admin/tenants/acme/keys/ci-bot"),
            ("GET", "/admin/usage"),
        ):
            error(await c.request(method, path, json={"name": "x"}), 401)
            error(
                await c.request(method, path, json={"name": "x"}, headers={"authorization": "Bearer no"}), 401
            )
            error(
                await c.request(method, path, json={"name": "x"}, headers=auth("acme")), 403
            )  # a tenant key
        assert await ask(c, "sk-ci") == 200


async def test_a_bug_behind_an_admin_route_is_an_openai_shaped_500_and_the_gateway_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def broken(*_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr("gateway.admin.admin_changes.patch_tenant", broken)
    async with tenancy_stack(CFG) as s:
        r = await s.client.patch("/admin/tenants/acme", json={"limits": {"rpm": 5}}, headers=OPS)
        err = error(r, 500)
        assert err["message"] == "internal error in kvgate" and "a bug" not in err["message"]
        assert (await s.client.get("/admin/tenants/acme", headers=OPS)).status_code == 200
        assert await ask(s.client, "sk-ci") == 200
