"""Adapter placement over real loopback HTTP: a target adapter that no replica holds is loaded (once,
however many requests wait for it) and served; the least recently used adapter makes room past
max_adapters_per_replica; a load that cannot happen is a 503 with Retry-After, or the fallback."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from simulator.fleet import SimFleet
from tests.gateway.ab_stack import V3, route
from tests.gateway.stack import MODEL, chat, metric_value, stack, wait_for


def models_cfg(**kw: Any) -> list[dict[str, Any]]:
    adapters = {"chat-v3": "/models/adapters/chat-v3", "sql": "/models/adapters/sql"}
    return [{"name": MODEL, "adapters": adapters, **kw}]


def count_loads(fleet: SimFleet, n: int) -> list[tuple[int, object]]:
    """Record every load the replicas are asked for: (replica index, adapter name)."""
    calls: list[tuple[int, object]] = []
    for i in range(n):
        registry = fleet.replica(i).models
        load = registry.load

        def counting(name: object, path: object, i: int = i, load: Any = load) -> str:
            calls.append((i, name))
            return str(load(name, path))

        registry.load = counting  # type: ignore[method-assign]
    return calls


async def served_models(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url) as c:
        return {m["id"]: m for m in (await c.get("/v1/models")).json()["data"]}


async def test_a_target_adapter_on_no_replica_is_loaded_once_and_served() -> None:
    cfg = {"models": models_cfg(), "routes": [route(targets=[{"model": V3, "weight": 1}])]}
    async with stack(replicas=2, config=cfg, max_loras=2) as s:
        calls = count_loads(s.fleet, 2)
        assert not s.gateway.model_routes.loader.loaded(MODEL, "chat-v3")
        reqs = [chat(f"q{i}", max_tokens=2, model="chat", stream=i % 2 == 0) for i in range(20)]
        answers = await asyncio.gather(*(s.client.post("/v1/chat/completions", json=r) for r in reqs))
        assert [r.status_code for r in answers] == [200] * 20, answers[0].text
        assert {r.headers["x-kvgate-target"] for r in answers} == {V3}
        assert [name for _, name in calls] == ["chat-v3"]  # one load for twenty waiting requests
        loaded_on = calls[0][0]
        card = (await served_models(s.fleet.urls[loaded_on]))["chat-v3"]
        assert card["parent"] == MODEL and card["root"] == "/models/adapters/chat-v3"
        assert {r.headers["x-kvgate-replica"] for r in answers} == {f"r{loaded_on}"}
        # by its served name and by its canonical name, as a model rather than through the route
        for name in ("chat-v3", V3):
            r = await s.client.post("/v1/chat/completions", json=chat("x", model=name))
            assert r.status_code == 200 and r.headers["x-kvgate-target"] == V3
        assert (
            await metric_value(s.client, "kvgate_adapter_loads_total", {"target": V3, "outcome": "ok"}) == 1
        )


async def test_the_least_recently_used_adapter_makes_room_past_the_limit() -> None:
    cfg = {"models": models_cfg(max_adapters_per_replica=1)}
    async with stack(replicas=1, config=cfg, max_loras=1) as s:
        r = await s.client.post("/v1/chat/completions", json=chat("x", model=V3))
        assert r.status_code == 200
        # An adapter the last scrape shows running is never evicted; on a busy machine that scrape
        # can still be the one taken while chat-v3 ran.
        await wait_for(lambda: not s.gateway.fleet.snapshot().by_name("r0").active_adapters)
        r = await s.client.post("/v1/chat/completions", json=chat("x", model=f"{MODEL}:sql"))
        assert r.status_code == 200 and r.headers["x-kvgate-target"] == f"{MODEL}:sql"
        held = await served_models(s.fleet.urls[0])
        assert "sql" in held and "chat-v3" not in held  # chat-v3 unloaded to stay within 1
        assert (
            await metric_value(s.client, "kvgate_adapter_unloads_total", {"target": V3, "outcome": "ok"}) == 1
        )
        r = await s.client.post("/v1/chat/completions", json=chat("x", model="chat-v3"))  # loaded again
        assert r.status_code == 200


async def test_an_adapter_that_cannot_be_loaded_is_a_503_with_retry_after_or_the_fallback() -> None:
    cfg = {
        "models": models_cfg(),
        "routes": [
            route(targets=[{"model": V3, "weight": 1}]),
            route(name="safe", targets=[{"model": V3, "weight": 1}], fallback=MODEL),
            route(name="ghost", targets=[{"model": f"{MODEL}:ghost", "weight": 1}], fallback=MODEL),
        ],
    }
    async with stack(replicas=1, config=cfg, max_loras=0) as s:  # LoRA off: every load is refused
        r = await s.client.post("/v1/chat/completions", json=chat("x", model="chat"))
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        err = r.json()["error"]
        assert err["code"] == "adapter_not_loaded" and V3 in err["message"]
        assert await metric_value(s.client, "kvgate_adapter_loads_total", {"outcome": "failed"}) == 1
        r = await s.client.post("/v1/chat/completions", json=chat("x", model="safe"))
        assert r.status_code == 200 and r.headers["x-kvgate-target"] == MODEL
        r = await s.client.post("/v1/chat/completions", json=chat("x", model="ghost"))  # no source at all
        assert r.status_code == 200 and r.headers["x-kvgate-target"] == MODEL
        labels = {"route": "ghost", "target": MODEL, "status": "200"}
        assert await metric_value(s.client, "kvgate_route_requests_total", labels) == 1
        await wait_for(lambda: s.gateway.model_routes.metrics.in_flight.get(("chat", V3, False)) == 0)


def slow_loads(fleet: SimFleet, n: int, delay_s: float) -> None:
    """Make the replicas take `delay_s` to answer a load (a real adapter is read from disk first)."""
    for i in range(n):
        routes = fleet.replica(i).app._routes
        key = ("POST", "/v1/load_lora_adapter")
        handler = routes[key]

        async def slow(scope: Any, receive: Any, send: Any, handler: Any = handler) -> None:
            await asyncio.sleep(delay_s)
            await handler(scope, receive, send)

        routes[key] = slow


async def test_requests_wait_for_a_slow_load_and_give_up_after_adapter_load_timeout_s() -> None:
    cfg = {"models": models_cfg(adapter_load_timeout_s=5.0)}
    async with stack(replicas=1, config=cfg, max_loras=1) as s:
        slow_loads(s.fleet, 1, 0.3)
        r = await s.client.post("/v1/chat/completions", json=chat("x", model=V3))
        assert r.status_code == 200 and r.headers["x-kvgate-target"] == V3  # waited, was served
    cfg = {"models": models_cfg(adapter_load_timeout_s=0.2)}
    async with stack(replicas=1, config=cfg, max_loras=1) as s:
        slow_loads(s.fleet, 1, 2.0)
        r = await s.client.post("/v1/chat/completions", json=chat("x", model=V3))
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert "was not ready within 0.2s" in r.json()["error"]["message"]
