"""A/B routing over real loopback HTTP: the sticky split, weight changes at runtime, the override
header, per-tenant weights, and what the answer says about what served it."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest

from gateway.auth_keys import hash_key
from tests.gateway.ab_stack import ADMIN, V2, route, targets_of
from tests.gateway.stack import MODEL, chat, metric_value, stack, wait_for
from tests.gateway.tenancy_stack import ADMIN_KEY, auth, tenancy_stack, tenant

FAST = {"flow_control": {"enabled": False}, "server": {"debug_headers": False}}
ADMIN_AUTH = {"auth": {"admin_keys": [hash_key(ADMIN_KEY)]}}


@pytest.mark.timeout(400)  # 23,000 requests through the real stack (~50 s on a quiet 2-core machine)
async def test_90_10_over_10000_sticky_keys_keys_keep_their_arm_and_80_20_moves_only_from_the_90_arm() -> (
    None
):
    cfg = {"routes": [route()], **FAST, **ADMIN_AUTH}
    async with stack(replicas=2, config=cfg, max_loras=2, adapters=("chat-v2",), time_scale=0.001) as s:
        await wait_for(lambda: "chat-v2" in s.gateway.fleet.models().adapters)
        keys = [f"session-{i}" for i in range(10_000)]
        first = await targets_of(s.server.url, keys)
        assert {st for st, _ in first.values()} == {200}
        arms = Counter(t for _, t in first.values())
        assert set(arms) == {MODEL, V2}
        assert abs(arms[V2] / len(keys) - 0.10) <= 0.015, arms
        again = await targets_of(s.server.url, keys[:1000])  # every key keeps its arm
        assert all(again[k] == first[k] for k in keys[:1000])

        r = await s.client.put("/admin/routes/chat", json={"weights": {MODEL: 80, V2: 20}}, headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json()["split"]["weights"] == {MODEL: 80, V2: 20} and r.json()["override"] is not None
        after = await targets_of(s.server.url, keys)
        moved = [(first[k][1], after[k][1]) for k in keys if first[k] != after[k]]
        assert abs(len(moved) / len(keys) - 0.10) <= 0.015, len(moved)
        assert set(moved) == {(MODEL, V2)}  # all from the 90 arm

        r = await s.client.delete("/admin/routes/chat", headers=ADMIN)
        assert r.status_code == 200 and r.json()["override"] is None
        back = await targets_of(s.server.url, keys[:2000])
        assert all(back[k] == first[k] for k in keys[:2000])


async def test_a_weight_change_applies_to_new_requests_and_leaves_streams_in_flight_alone() -> None:
    cfg = {"routes": [route(sticky_by=[])], **ADMIN_AUTH}
    async with stack(replicas=1, config=cfg, max_loras=1, adapters=("chat-v2",), time_scale=20.0) as s:
        await wait_for(lambda: "chat-v2" in s.gateway.fleet.models().adapters)
        r = await s.client.put("/admin/routes/chat", json={"weights": {MODEL: 0, V2: 1}}, headers=ADMIN)
        assert r.status_code == 200
        req = chat("a long answer", max_tokens=8, model="chat", stream=True)
        async with s.client.stream("POST", "/v1/chat/completions", json=req) as stream:
            assert stream.headers["x-kvgate-target"] == V2
            lines = stream.aiter_lines()
            first = [await anext(lines) for _ in range(2)]
            r = await s.client.put("/admin/routes/chat", json={"weights": {MODEL: 1, V2: 0}}, headers=ADMIN)
            assert r.status_code == 200
            r2 = await s.client.post(
                "/v1/completions", json={"model": "chat", "prompt": "x", "max_tokens": 1}
            )
            assert r2.headers["x-kvgate-target"] == MODEL  # new requests: the new weights
            rest = [line async for line in lines]
        events = [e for e in first + rest if e.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert sum('"content"' in e and '"content":""' not in e for e in events) == 8  # the whole answer
        assert all(orjson.loads(e[6:])["model"] == "chat" for e in events[:-1])


async def test_override_header_is_for_override_tenants_only_and_must_name_a_target() -> None:
    cfg = {
        "routes": [route(override_tenants=["qa"])],
        "tenants": [tenant("qa"), tenant("acme")],
    }
    async with tenancy_stack(cfg, max_loras=2, adapters=("chat-v2",)) as s:
        await wait_for(lambda: "chat-v2" in s.gateway.fleet.models().adapters)
        force = {"x-kvgate-force-target": V2}
        for i in range(20):
            h = {**auth("qa"), **force, "x-session-id": f"k{i}"}
            r = await s.client.post("/v1/chat/completions", json=chat("hi", model="chat"), headers=h)
            assert r.status_code == 200 and r.headers["x-kvgate-target"] == V2
        r = await s.client.post(
            "/v1/chat/completions", json=chat("hi", model="chat"), headers={**auth("acme"), **force}
        )
        assert r.status_code == 403
        err = r.json()["error"]
        assert err["param"] == "x-kvgate-force-target" and "x-kvgate-force-target" in err["message"]
        assert err["type"] == "permission_error" and err["code"] == "override_not_allowed"
        h = {**auth("qa"), "x-kvgate-force-target": "tiny-llama:nope"}
        r = await s.client.post("/v1/chat/completions", json=chat("hi", model="chat"), headers=h)
        assert (
            r.status_code == 400
            and "expected one of: tiny-llama, tiny-llama:chat-v2" in r.json()["error"]["message"]
        )
        # the header means nothing on a request for a model rather than a route
        h = {**auth("acme"), **force}
        r = await s.client.post("/v1/chat/completions", json=chat("hi"), headers=h)
        assert r.status_code == 200 and r.headers["x-kvgate-target"] == MODEL


async def test_per_tenant_weights_and_tenant_allow_lists_by_canonical_name() -> None:
    cfg = {
        "routes": [
            route(tenant_targets={"acme": [{"model": MODEL, "weight": 0}, {"model": V2, "weight": 1}]})
        ],
        "tenants": [
            tenant("acme"),
            tenant("other"),
            tenant("adapters-only", models=["tiny-llama:*"]),
            tenant("route-user", models=["chat", MODEL, "tiny-llama:*"]),
        ],
    }
    async with tenancy_stack(cfg, max_loras=2, adapters=("chat-v2",)) as s:
        await wait_for(lambda: "chat-v2" in s.gateway.fleet.models().adapters)
        acme = await targets_of(s.server.url, [f"a{i}" for i in range(40)], headers=auth("acme"))
        assert {t for _, t in acme.values()} == {V2}
        other = await targets_of(s.server.url, [f"a{i}" for i in range(200)], headers=auth("other"))
        assert {t for _, t in other.values()} == {MODEL, V2}
        # "tiny-llama:*" admits the adapter whatever name the client used for it, and not the base
        for name in ("chat-v2", V2):
            r = await s.client.post(
                "/v1/chat/completions", json=chat("x", model=name), headers=auth("adapters-only")
            )
            assert r.status_code == 200 and r.headers["x-kvgate-target"] == V2, r.text
        r = await s.client.post("/v1/chat/completions", json=chat("x"), headers=auth("adapters-only"))
        assert r.status_code == 403
        r = await s.client.post(
            "/v1/chat/completions", json=chat("x", model="chat"), headers=auth("adapters-only")
        )
        assert r.status_code == 403 and "`chat`" in r.json()["error"]["message"]  # the route itself
        r = await s.client.post(
            "/v1/chat/completions", json=chat("x", model="chat"), headers=auth("route-user")
        )
        assert r.status_code == 200


async def test_the_answer_names_what_served_it_and_carries_the_name_the_client_sent() -> None:
    async with stack(
        replicas=1, config={"routes": [route(sticky_by=[])]}, max_loras=1, adapters=("chat-v2",)
    ) as s:
        await wait_for(lambda: "chat-v2" in s.gateway.fleet.models().adapters)
        for sent, target in (("chat", None), (V2, V2), ("chat-v2", V2), (MODEL, MODEL)):
            for stream in (False, True):
                req = chat("hello", max_tokens=3, model=sent, stream=stream)
                r = await s.client.post("/v1/chat/completions", json=req)
                assert r.status_code == 200, r.text
                assert r.headers["x-kvgate-replica"] == "r0"
                assert target is None or r.headers["x-kvgate-target"] == target
                if stream:
                    bodies = [orjson.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
                else:
                    bodies = [r.json()]
                assert bodies and all(b["model"] == sent for b in bodies)  # the client's own name
        gaps = {"route": "chat", "shadow": "false"}  # the one routed stream (3 tokens): gaps seen
        assert await metric_value(s.client, "kvgate_route_inter_chunk_latency_seconds_count", gaps) >= 1
        assert await metric_value(s.client, "kvgate_route_inter_chunk_latency_seconds_sum", gaps) > 0
        models = (await s.client.get("/v1/models")).json()["data"]
        assert {"id": "chat", "parent": None}.items() <= next(m for m in models if m["id"] == "chat").items()
        r = await s.client.post("/v1/chat/completions", json=chat("x", model="nope"))
        assert r.status_code == 404 and "chat" in r.json()["error"]["message"]


async def test_per_variant_metrics_and_the_admin_view() -> None:
    cfg = {"routes": [route()], **ADMIN_AUTH}
    async with stack(replicas=2, config=cfg, max_loras=2, adapters=("chat-v2",)) as s:
        await wait_for(lambda: "chat-v2" in s.gateway.fleet.models().adapters)
        got = await targets_of(s.server.url, [f"k{i}" for i in range(100)], concurrency=8)
        per = Counter(t for _, t in got.values())
        c = s.client
        for target, n in per.items():
            labels = {"route": "chat", "target": target, "shadow": "false"}
            assert await metric_value(c, "kvgate_route_requests_total", {**labels, "status": "200"}) == n
            assert await metric_value(c, "kvgate_route_time_to_first_token_seconds_count", labels) == n
            assert await metric_value(c, "kvgate_route_tokens_total", {**labels, "kind": "completion"}) == n
        assert await metric_value(c, "kvgate_route_errors_total") == 0
        view = (await c.get("/admin/routes", headers=ADMIN)).json()["data"][0]
        assert view["name"] == "chat" and view["override"] is None and view["shared"] is False
        assert view["split"]["weights"] == {MODEL: 90, V2: 10} and view["split"]["buckets"] == {
            MODEL: 9000,
            V2: 1000,
        }
        for target, n in per.items():
            arm = view["arms"][target]["primary"]
            assert arm["requests"] == {"200": n} and arm["in_flight"] == 0 and arm["ttft_s"]["count"] == n
        assert (await c.get("/admin/routes/nope", headers=ADMIN)).status_code == 404
        assert (await c.get("/admin/routes")).status_code == 401


async def test_bad_weight_changes_are_refused_and_change_nothing() -> None:
    targets = [{"model": MODEL, "weight": 100}, {"model": V2, "weight": 0}]  # t may not use V2
    cfg = {"routes": [route(targets=targets)], "tenants": [tenant("t", models=["chat", MODEL])], **ADMIN_AUTH}
    async with tenancy_stack(cfg) as s:
        c = s.client
        for body, msg in (
            ({"weights": {MODEL: 1}}, "missing: tiny-llama:chat-v2"),
            ({"weights": {MODEL: 1, V2: 1, "x": 1}}, "unknown: x"),
            ({"weights": {MODEL: 0, V2: 0}}, "positive sum"),
            ({"weights": {MODEL: 1.5, V2: 1}}, "integers"),
            ({"tenant_weights": {"acme": {MODEL: 1}}}, "no tenant_targets for 'acme'"),
            ({"nonsense": 1}, "expected an object"),
            ({"weights": {MODEL: 1, V2: 0}}, None),  # fine: t may use the base
            ({"weights": {MODEL: 1, V2: 1}}, "tenant 't' may use route 'chat' but not tiny-llama:chat-v2"),
        ):
            r = await c.put("/admin/routes/chat", json=body, headers=ADMIN)
            if msg is None:
                assert r.status_code == 200
                continue
            assert r.status_code == 400 and msg in r.json()["error"]["message"], (body, r.text)
        r = await c.put("/admin/routes/chat", content=b"{", headers=ADMIN)
        assert r.status_code == 400
        assert (await c.get("/admin/routes/chat", headers=ADMIN)).json()["split"]["weights"] == {
            MODEL: 1,
            V2: 0,
        }
        assert (await c.put("/admin/routes/nope", json={}, headers=ADMIN)).status_code == 404
