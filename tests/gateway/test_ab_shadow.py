"""Shadow traffic over real loopback HTTP: copies reach the mirror target after the primary, are not
charged to the tenant, are counted apart (shadow="true"), and a mirror that errors, hangs or is
saturated changes nothing for the client; copies still running are cancelled at shutdown."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from gateway.config import parse_config
from gateway.server import GatewayServer
from simulator.fleet import SimFleet
from simulator.server.faults import FaultConfig
from tests.gateway.ab_stack import route
from tests.gateway.stack import MODEL, Stack, chat, merge, metric_value, wait_for, wait_until_scraped
from tests.gateway.tenancy_stack import auth, base_config, tenant

MIRROR = "mirror-llama"  # the mirror target is a pool of its own: what reaches it is countable


@contextlib.asynccontextmanager
async def mirror_stack(
    extra: dict[str, Any], mirror_faults: FaultConfig | None = None
) -> AsyncIterator[tuple[Stack, SimFleet]]:
    async with contextlib.AsyncExitStack() as es:
        main = await es.enter_async_context(SimFleet(replicas=2, profile="tiny"))
        mirror = await es.enter_async_context(
            SimFleet(replicas=1, profile="tiny", model=MIRROR, faults=mirror_faults)
        )
        cfg = parse_config(merge(base_config([(main, MODEL, "r"), (mirror, MIRROR, "m")]), extra))
        server = await es.enter_async_context(GatewayServer(cfg))
        client = await es.enter_async_context(httpx.AsyncClient(base_url=server.url, timeout=30))
        s = Stack(main, server, client)
        await wait_until_scraped(s)
        yield s, mirror


def mirrored(percent: float = 100, max_in_flight: int = 50, **kw: Any) -> dict[str, Any]:
    return route(
        targets=[{"model": MODEL, "weight": 1}],
        mirror={"model": MIRROR, "percent": percent, "max_in_flight": max_in_flight},
        **kw,
    )


async def replica_finished(url: str) -> float:
    async with httpx.AsyncClient(base_url=url) as c:
        return await metric_value(c, "vllm:request_success_total")


async def test_mirror_copies_reach_the_mirror_target_and_are_not_charged_to_the_tenant() -> None:
    burst = 20  # one request a minute refills nothing during the test: exactly `burst` pass
    cfg = {"routes": [mirrored()], "tenants": [tenant("acme", limits={"rpm": 1, "rpm_burst": burst})]}
    async with mirror_stack(cfg) as (s, mirror):
        c = s.client
        for i in range(burst):
            stream = i % 2 == 0
            r = await c.post(
                "/v1/chat/completions",
                json=chat(f"q{i}", max_tokens=4, model="chat", stream=stream),
                headers=auth("acme"),
            )
            assert r.status_code == 200 and r.headers["x-kvgate-target"] == MODEL
        r = await c.post("/v1/chat/completions", json=chat("one more", model="chat"), headers=auth("acme"))
        assert r.status_code == 429  # the copies took nothing from the bucket: 20 primaries, then 429
        shadow = {"route": "chat", "target": MIRROR, "shadow": "true"}
        await wait_for(lambda: s.gateway.model_routes.shadow.running == 0)
        assert await metric_value(c, "kvgate_route_requests_total", {**shadow, "status": "200"}) == burst
        assert await metric_value(c, "kvgate_route_time_to_first_token_seconds_count", shadow) == burst
        assert await replica_finished(mirror.urls[0]) == burst  # the mirror replica served every copy
        primary = {"route": "chat", "target": MODEL, "shadow": "false"}
        used = sum([await metric_value(c, "kvgate_route_tokens_total", {**primary, "kind": k})
                    for k in ("prompt", "completion")])  # fmt: skip
        assert await metric_value(c, "kvgate_tenant_tokens_charged_total", {"tenant": "acme"}) == used
        assert (
            await metric_value(c, "kvgate_route_requests_total", {"shadow": "false", "status": "200"})
            == burst
        )
        assert await metric_value(c, "kvgate_tokens_total", {"model": MIRROR}) == 0  # not the tenant's


async def test_a_mirror_that_errors_changes_nothing_for_the_client() -> None:
    async with mirror_stack({"routes": [mirrored()]}, FaultConfig(error_rate=1.0, error_status=500)) as (
        s,
        _,
    ):
        for i in range(10):
            r = await s.client.post(
                "/v1/chat/completions", json=chat(f"q{i}", model="chat", stream=i % 2 == 0)
            )
            assert r.status_code == 200 and "error" not in r.text
        await wait_for(lambda: s.gateway.model_routes.shadow.running == 0)
        labels = {"route": "chat", "target": MIRROR, "shadow": "true"}
        assert await metric_value(s.client, "kvgate_route_errors_total", labels) == 10
        assert await metric_value(s.client, "kvgate_route_errors_total", {"shadow": "false"}) == 0


async def test_a_mirror_that_hangs_changes_nothing_is_bounded_and_is_cancelled_at_shutdown() -> None:
    async with mirror_stack({"routes": [mirrored(max_in_flight=3)]}, FaultConfig(hang_after_chunks=0)) as (
        s,
        _,
    ):
        gw = s.gateway
        for i in range(10):
            r = await s.client.post("/v1/chat/completions", json=chat(f"q{i}", max_tokens=3, model="chat"))
            assert r.status_code == 200
        assert gw.model_routes.shadow.running == 3  # hung, still waiting for a first byte
        dropped = await metric_value(s.client, "kvgate_route_mirror_dropped_total", {"reason": "concurrency"})
        assert dropped == 7
    assert gw.model_routes.shadow.running == 0  # cancelled when kvgate stopped


async def test_a_saturated_mirror_pool_drops_copies_instead_of_queueing_them() -> None:
    cfg = {
        "routes": [mirrored(max_in_flight=10)],
        "flow_control": {
            "saturation": {"max_in_flight_per_replica": 2},
            "fair_share": {"reserve_per_replica": 0},
        },
    }
    async with mirror_stack(cfg, FaultConfig(hang_after_chunks=0)) as (s, _):
        for i in range(6):
            r = await s.client.post("/v1/chat/completions", json=chat(f"q{i}", max_tokens=2, model="chat"))
            assert r.status_code == 200
        assert s.gateway.model_routes.shadow.running == 2  # the mirror replica's two slots
        assert await metric_value(s.client, "kvgate_route_mirror_dropped_total", {"reason": "saturated"}) == 4


async def test_sampling_sends_about_the_mirror_percent() -> None:
    async with mirror_stack({"routes": [mirrored(percent=25)]}) as (s, _):
        for i in range(200):
            r = await s.client.post(
                "/v1/completions", json={"model": "chat", "prompt": f"p{i}", "max_tokens": 1}
            )
            assert r.status_code == 200
        await wait_for(lambda: s.gateway.model_routes.shadow.running == 0)
        copies = await metric_value(s.client, "kvgate_route_requests_total", {"shadow": "true"})
        assert 25 <= copies <= 75  # 25% of 200, seeded draws


async def test_with_engine_priorities_copies_are_sent_below_every_band() -> None:
    # The main replicas schedule by priority; the mirror replica does not, so it refuses any request
    # that carries one (vLLM's 400): every copy is refused, which shows that copies carry a priority.
    cfg = {"routes": [mirrored()], "flow_control": {"pass_priority": True}}
    async with contextlib.AsyncExitStack() as es:
        main = await es.enter_async_context(
            SimFleet(replicas=1, profile="tiny", scheduling_policy="priority")
        )
        mirror = await es.enter_async_context(SimFleet(replicas=1, profile="tiny", model=MIRROR))
        config = parse_config(merge(base_config([(main, MODEL, "r"), (mirror, MIRROR, "m")]), cfg))
        server = await es.enter_async_context(GatewayServer(config))
        client = await es.enter_async_context(httpx.AsyncClient(base_url=server.url, timeout=30))
        s = Stack(main, server, client)
        await wait_until_scraped(s)
        for i in range(4):
            r = await client.post("/v1/chat/completions", json=chat(f"q{i}", model="chat"))
            assert r.status_code == 200
        await wait_for(lambda: s.gateway.model_routes.shadow.running == 0)
        assert (
            await metric_value(client, "kvgate_route_requests_total", {"shadow": "true", "status": "400"})
            == 4
        )
    from gateway.shadow import SHADOW_PRIORITY
    from policies.types import Band

    assert max(int(b) for b in Band) < SHADOW_PRIORITY
