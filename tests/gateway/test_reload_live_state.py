"""A reload meets what the admin API changed at run time: route weights set through `PUT
/admin/routes` go back to the file's (and the reload says so), keys made or revoked through the admin
API stay made or revoked, and a gateway that started open takes its first tenants from a reload."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.reload_stack import ADMIN, reload_stack
from tests.gateway.stack import MODEL, chat
from tests.gateway.tenancy_stack import auth, tenant

ROUTE = {"name": "chat", "targets": [{"model": MODEL, "weight": 1}]}


async def test_a_reload_puts_route_weights_back_to_the_file_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg: dict[str, Any] = {"tenants": [tenant("acme")], "routes": [ROUTE]}
    async with reload_stack(tmp_path, cfg) as rs:
        r = await rs.client.put("/admin/routes/chat", json={"weights": {MODEL: 5}}, headers=ADMIN)
        assert r.status_code == 200, r.text
        view = (await rs.client.get("/admin/routes/chat", headers=ADMIN)).json()
        assert view["override"] is not None
        caplog.set_level(logging.WARNING)
        rs.write(cfg)  # the same file: only the runtime weights differ from it
        assert (await rs.reload()).status_code == 200
        view = (await rs.client.get("/admin/routes/chat", headers=ADMIN)).json()
        assert view["override"] is None
        assert "routes reset to the file (runtime weights dropped: chat)" in caplog.text
        r = await rs.client.post("/v1/chat/completions", json=chat("hi", model="chat"), headers=auth("acme"))
        assert r.status_code == 200 and r.headers["x-kvgate-target"] == MODEL


async def test_keys_made_or_revoked_through_the_admin_api_survive_a_reload(tmp_path: Path) -> None:
    cfg: dict[str, Any] = {"tenants": [tenant("acme", limits={"rpm": 600})]}
    async with reload_stack(tmp_path, cfg) as rs:
        made = await rs.client.post("/admin/tenants/acme/keys", json={"name": "svc"}, headers=ADMIN)
        assert made.status_code == 201, made.text
        key = {"authorization": f"Bearer {made.json()['key']}"}
        revoked = await rs.client.delete(
            "/admin/tenants/acme/keys/unnamed-" + tenant("acme")["api_keys"][0][7:15], headers=ADMIN
        )
        assert revoked.status_code == 200, revoked.text

        async def ask(headers: dict[str, str]) -> int:
            return (
                await rs.client.post("/v1/chat/completions", json=chat("hi"), headers=headers)
            ).status_code

        assert (await ask(key), await ask(auth("acme"))) == (200, 401)
        rs.write({"tenants": [tenant("acme", limits={"rpm": 1200})]})  # a limit changes in the file
        r = await rs.reload()
        assert r.status_code == 200, r.text
        assert (await ask(key), await ask(auth("acme"))) == (200, 401)  # the API's changes still hold
        status = (await rs.client.get("/admin/tenants/acme", headers=ADMIN)).json()
        assert status["limits"]["rpm"] == 1200


async def test_a_gateway_that_started_open_takes_its_first_tenants_from_a_reload(tmp_path: Path) -> None:
    async with reload_stack(tmp_path, {}) as rs:
        assert (await rs.client.post("/v1/chat/completions", json=chat("hi"))).status_code == 200
        rs.write({"tenants": [tenant("acme", limits={"rpm": 1, "rpm_burst": 1})]})
        r = await rs.reload()
        assert r.status_code == 200, r.text
        assert (await rs.client.post("/v1/chat/completions", json=chat("hi"))).status_code == 401
        first = await rs.client.post("/v1/chat/completions", json=chat("hi"), headers=auth("acme"))
        second = await rs.client.post("/v1/chat/completions", json=chat("hi"), headers=auth("acme"))
        assert (first.status_code, second.status_code) == (200, 429)  # its limit is enforced at once
