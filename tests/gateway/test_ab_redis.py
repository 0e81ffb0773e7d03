"""A/B routing with two kvgate PROCESSES sharing a private Redis: a weight change made on one reaches
the other (pub/sub, and the periodic resync when the message is lost), both put every key on the
same target, and an adapter both need is loaded once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import redis

from gateway.config import parse_config
from gateway.route_table import RouteTable
from simulator.fleet import SimFleet
from tests.gateway.ab_stack import ADMIN, V2, V3, route, targets_of
from tests.gateway.redis_server import RedisServer, redis_server  # noqa: F401
from tests.gateway.stack import MODEL, chat, merge
from tests.gateway.tenancy_stack import base_config
from tests.gateway.test_ab_placement import count_loads
from tests.gateway.test_tenancy_redis import Gateways


@contextlib.asynccontextmanager
async def two_gateways(
    extra: dict[str, Any], tmp: Path, url: str, **fleet_kw: Any
) -> AsyncIterator[tuple[Gateways, SimFleet, dict[str, Any]]]:
    async with SimFleet(replicas=2, profile="tiny", max_loras=2, **fleet_kw) as fleet:
        cfg = merge(base_config([(fleet, MODEL, "r")]), {"state": {"store": url}, **extra})
        gws = Gateways(cfg, tmp)
        try:
            await gws.ready()
            yield gws, fleet, cfg
        finally:
            await gws.close()


async def until(c: httpx.AsyncClient, path: str, pred: Any, timeout: float = 10.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            doc = (await c.get(path, headers=ADMIN)).json()
            if pred(doc):
                return dict(doc)
            await asyncio.sleep(0.05)


async def serves_v2(c: httpx.AsyncClient) -> None:
    async with asyncio.timeout(15):
        while "chat-v2" not in {m["id"] for m in (await c.get("/v1/models")).json()["data"]}:  # noqa: ASYNC110
            await asyncio.sleep(0.1)


async def test_a_weight_change_on_one_gateway_reaches_the_other_and_both_agree_on_every_key(
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with two_gateways({"routes": [route()]}, tmp_path, redis_server.url, adapters=("chat-v2",)) as (
        gws,
        _,
        cfg,
    ):
        a, b = gws.clients
        for c in gws.clients:
            await serves_v2(c)
        r = await a.put("/admin/routes/chat", json={"weights": {MODEL: 50, V2: 50}}, headers=ADMIN)
        assert r.status_code == 200, r.text
        doc = await until(b, "/admin/routes/chat", lambda d: d["override"] is not None)
        assert doc["split"]["weights"] == {MODEL: 50, V2: 50} and doc["shared"] is True
        keys = [f"k{i}" for i in range(400)]
        on_a = await targets_of(str(a.base_url), keys)
        on_b = await targets_of(str(b.base_url), keys)
        assert on_a == on_b  # the same key, the same target, whichever gateway it reaches
        assert {t for _, t in on_a.values()} == {MODEL, V2}

        # A change whose message is lost (written to Redis without PUBLISH) heals by the resync.
        table = RouteTable(parse_config(cfg))
        current = table.propose("chat", {"weights": {MODEL: 50, V2: 50}}, None)
        lost = table.propose("chat", {"weights": {MODEL: 0, V2: 1}}, current)
        store = redis.Redis.from_url(redis_server.url)
        try:
            version = int(store.get("kvgate:route:chat:v") or 0) + 1
            store.set("kvgate:route:chat", dataclasses.replace(lost, version=version).encode())
            store.set("kvgate:route:chat:v", version)
        finally:
            store.close()
        for c in gws.clients:  # within the resync interval (2 s), with margin for a busy machine
            await until(c, "/admin/routes/chat", lambda d: d["split"]["weights"] == {MODEL: 0, V2: 1})
        for c in gws.clients:
            got = await targets_of(str(c.base_url), keys[:50])
            assert {t for _, t in got.values()} == {V2}

        r = await b.delete("/admin/routes/chat", headers=ADMIN)
        assert r.status_code == 200
        await until(a, "/admin/routes/chat", lambda d: d["override"] is None)
        assert gws.alive(), gws.why()


async def test_two_gateways_load_an_adapter_once(
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    extra = {
        "models": [{"name": MODEL, "adapters": {"chat-v3": "/models/adapters/chat-v3"}}],
        "routes": [route(targets=[{"model": V3, "weight": 1}])],
    }
    async with two_gateways(extra, tmp_path, redis_server.url) as (gws, fleet, _):
        calls = count_loads(fleet, 2)
        reqs = [
            c.post("/v1/chat/completions", json=chat(f"q{i}", max_tokens=2, model="chat"))
            for i in range(10)
            for c in gws.clients
        ]
        answers = await asyncio.gather(*reqs)
        assert [r.status_code for r in answers] == [200] * 20, answers[0].text
        assert {r.headers["x-kvgate-target"] for r in answers} == {V3}
        assert [name for _, name in calls] == ["chat-v3"]  # one load, by one of the two gateways
