"""A/B routing and operations: a config reload puts the routes back to the file (and says so), and a
route store that does not answer refuses a weight change with 503 while requests go on."""

from __future__ import annotations

import logging

import pytest

from gateway.config import parse_config
from tests.gateway.ab_stack import ADMIN, V2, route
from tests.gateway.redis_server import RedisServer, redis_server  # noqa: F401
from tests.gateway.stack import MODEL, chat, wait_for
from tests.gateway.tenancy_stack import base_config, tenancy_stack


async def test_a_reload_resets_routes_to_the_file_and_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    cfg = {"routes": [route()]}
    async with tenancy_stack(cfg, max_loras=2, adapters=("chat-v2",)) as s:
        r = await s.client.put("/admin/routes/chat", json={"weights": {MODEL: 1, V2: 1}}, headers=ADMIN)
        assert r.status_code == 200 and r.json()["override"] is not None
        new = dict(base_config([(s.fleet, MODEL, "r")]))
        new["routes"] = [route(targets=[{"model": MODEL, "weight": 3}, {"model": V2, "weight": 1}])]
        with caplog.at_level(logging.WARNING, logger="gateway.model_routes"):
            await s.gateway.model_routes.reload(parse_config(new))
        assert "routes reset to the file (runtime weights dropped: chat)" in caplog.text
        view = (await s.client.get("/admin/routes/chat", headers=ADMIN)).json()
        assert view["override"] is None and view["split"]["weights"] == {MODEL: 3, V2: 1}
        await wait_for(lambda: "chat-v2" in s.gateway.fleet.models().adapters)
        r = await s.client.post("/v1/chat/completions", json=chat("x", model="chat"))
        assert r.status_code == 200


async def test_weight_changes_need_the_shared_store_and_requests_do_not(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    cfg = {"routes": [route()], "state": {"store": redis_server.url}}
    async with tenancy_stack(cfg, max_loras=2, adapters=("chat-v2",)) as s:
        r = await s.client.put("/admin/routes/chat", json={"weights": {MODEL: 1, V2: 3}}, headers=ADMIN)
        assert r.status_code == 200
        redis_server.stop()
        r = await s.client.put("/admin/routes/chat", json={"weights": {MODEL: 1, V2: 0}}, headers=ADMIN)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "nothing was changed" in r.json()["error"]["message"]
        view = (await s.client.get("/admin/routes/chat", headers=ADMIN)).json()
        assert view["split"]["weights"] == {MODEL: 1, V2: 3}  # the last weights in force stay
        for i in range(5):
            r = await s.client.post("/v1/chat/completions", json=chat(f"q{i}", model="chat"))
            assert r.status_code == 200
        redis_server.start()  # empty: no override stored, so back to the file's weights
        await wait_for(
            lambda: s.gateway.model_routes.table.routes["chat"].split.weights == (90, 10), timeout=15
        )
