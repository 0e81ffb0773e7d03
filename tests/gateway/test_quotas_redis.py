"""Quotas, the usage ledger and live keys through a real private Redis: two kvgate PROCESSES
(`python -m gateway.cli serve`) in front of one simulated fleet share one day quota under concurrent
streams, their ledgers add up to what the replicas reported, a key created on one works at once on
the other and a revoked one fails at once; a lost change message heals within the resync interval;
and on the Redis store a window resets at the calendar boundary of its zone (injected clock)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis.asyncio as aioredis

from gateway.auth_keys import hash_key
from gateway.policy_overrides import KeyRecord
from gateway.tokenizers import SimTokenizer
from simulator.fleet import SimFleet
from tests.gateway.redis_server import RedisServer, redis_server  # noqa: F401
from tests.gateway.stack import MODEL, chat, merge
from tests.gateway.stores.fakes import FakeClock
from tests.gateway.tenancy_stack import ADMIN_KEY, auth, base_config, tenancy_stack, tenant
from tests.gateway.test_tenancy_redis import Gateways

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
PROMPT = chat("Summarise the quarterly numbers for the board, briefly.", max_tokens=16)
RESERVATION = len(SimTokenizer().encode_chat(PROMPT["messages"])) + 16


def noon_zone() -> str:
    """A fixed-offset zone where it is about noon now, so a day window cannot end during the test."""
    offset = 12 - datetime.now(UTC).hour  # Etc/GMT-3 is UTC+3
    return "Etc/GMT" + (f"{-offset:+d}" if offset else "")


def shared(url: str) -> dict[str, Any]:
    return {
        "store": url,
        "gateways": 2,
        "timeout_s": 1.0,
        "resync_interval_s": 0.5,
        "propagation_timeout_s": 5.0,
    }


@contextlib.asynccontextmanager
async def two_gateways(config: dict[str, Any], tmp: Path) -> AsyncIterator[Gateways]:
    async with SimFleet(replicas=2, profile="tiny") as fleet:
        gws = Gateways(merge(base_config([(fleet, MODEL, "r")]), config), tmp)
        try:
            await gws.ready()
            yield gws
        finally:
            await gws.close()


async def stream(c: httpx.AsyncClient, headers: dict[str, str]) -> tuple[int, dict[str, Any] | None]:
    body = {**PROMPT, "stream": True, "stream_options": {"include_usage": True}}
    async with c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, None
        events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
    return 200, orjson.loads(events[-2][6:])["usage"]


async def test_two_gateways_share_a_day_quota_under_concurrent_streams_and_their_ledgers_add_up(
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    limit = 10 * RESERVATION + RESERVATION // 2
    zone = noon_zone()
    cfg = {
        "tenants": [tenant("acme", quotas=[{"tokens": limit, "per": "day", "timezone": zone}])],
        "state": shared(redis_server.url),
        "ledger": {"flush_interval_s": 0.2},
    }
    async with two_gateways(cfg, tmp_path) as gws:
        results = await asyncio.gather(*(stream(gws.clients[i % 2], auth("acme")) for i in range(40)))
        used = [u for status, u in results if u is not None]
        assert {status for status, _ in results} == {200, 429}
        assert sum(1 for status, _ in results if status == 200) == len(used)
        charged = sum(u["prompt_tokens"] + u["completion_tokens"] for u in used)
        assert len(used) * RESERVATION <= limit + RESERVATION  # one quota across both gateways, within one
        assert charged <= limit + RESERVATION  # reservation of it
        assert len(used) >= limit // RESERVATION - 1
        served = [sum(1 for i, (s, _) in enumerate(results) if s == 200 and i % 2 == g) for g in (0, 1)]
        assert all(served), served  # both gateways admitted some
        r = await gws.clients[1].post("/v1/chat/completions", json=PROMPT, headers=auth("acme"))
        assert r.status_code == 429 and r.headers["x-kvgate-quota-limit"] == str(limit)
        assert 0 < int(r.headers["retry-after"]) <= 13 * 3600
        for c in gws.clients:  # both see the one shared counter, exactly what the replicas reported
            (q,) = (await c.get("/admin/tenants/acme", headers=ADMIN)).json()["quotas"]
            assert q["used"] == charged and q["timezone"] == zone

        # the ledger: each gateway flushes its own usage; together they equal the replicas' reports
        async def ledger_total() -> dict[str, int]:
            r = await gws.clients[0].get(
                "/admin/usage",
                params={"tenant": "acme", "group_by": "total", "dims": "tenant"},
                headers=ADMIN,
            )
            return dict(r.json()["totals"])

        expected = {
            "requests": len(used),
            "prompt_tokens": sum(u["prompt_tokens"] for u in used),
            "output_tokens": sum(u["completion_tokens"] for u in used),
        }
        async with asyncio.timeout(10):
            while {k: v for k, v in (await ledger_total()).items() if k in expected} != expected:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert gws.alive(), gws.why()


async def test_a_key_made_on_one_gateway_works_at_once_on_the_other_and_a_revoked_one_fails_at_once(
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    cfg = {
        "tenants": [
            tenant("acme", limits={"rpm": 600}, keys=[{"name": "leaky", "hash": hash_key("sk-leaky")}])
        ],
        "state": shared(redis_server.url),
    }
    async with two_gateways(cfg, tmp_path) as gws:
        a, b = gws.clients

        async def ask(c: httpx.AsyncClient, key: str) -> int:
            headers = {"authorization": f"Bearer {key}"}
            return (await c.post("/v1/chat/completions", json=chat("hi"), headers=headers)).status_code

        r = await a.post("/admin/tenants/acme/keys", json={"name": "svc"}, headers=ADMIN)
        assert r.status_code == 201, r.text
        made = r.json()
        assert made["propagation"]["gateways"] == 2 and made["propagation"]["pending"] == []
        key = made["key"]
        assert await ask(b, key) == 200 and await ask(a, key) == 200  # at once, on both
        r = await a.delete("/admin/tenants/acme/keys/svc", headers=ADMIN)
        assert r.status_code == 200 and r.json()["propagation"]["pending"] == []
        assert await ask(b, key) == 401 and await ask(a, key) == 401  # at once, on both
        # a leaked key from the config, revoked on B, fails at once on A
        assert await ask(a, "sk-leaky") == 200
        assert (await b.delete("/admin/tenants/acme/keys/leaky", headers=ADMIN)).status_code == 200
        assert await ask(a, "sk-leaky") == 401
        # limits changed on A hold on B at once
        r = await a.patch("/admin/tenants/acme", json={"limits": {"rpm": 1, "rpm_burst": 1}}, headers=ADMIN)
        assert r.status_code == 200 and r.json()["propagation"]["pending"] == []
        status = (await b.get("/admin/tenants/acme", headers=ADMIN)).json()
        assert status["limits"]["rpm"] == 1 and status["overrides"]["limits"]["rpm"] == 1
        assert [await ask(b, "sk-test-acme"), await ask(a, "sk-test-acme")] == [200, 429]

        # a change whose message is lost (written to Redis without PUBLISH) heals within the resync
        raw = aioredis.Redis.from_url(redis_server.url)
        try:
            h = hash_key("sk-test-acme")
            revoke = KeyRecord(
                tenant="acme",
                name="unnamed-" + h[7:15],
                hash=h,
                source="config",
                revoked_at=time.time(),
                revoked_by="t",
            )
            async with raw.pipeline(transaction=True) as tx:
                tx.hset("kvgate:{admin}:keys", revoke.hash, revoke.dumps())
                tx.incr("kvgate:{admin}:generation")
                await tx.execute()
            async with asyncio.timeout(5):  # resync_interval_s is 0.5, each gateway on its own clock
                for c in (b, a):
                    while await ask(c, "sk-test-acme") != 401:  # noqa: ASYNC110
                        await asyncio.sleep(0.05)
        finally:
            await raw.aclose()
        assert gws.alive(), gws.why()


async def test_a_window_resets_at_midnight_in_its_zone_on_the_redis_store(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    """Asia/Kolkata is UTC+5:30: its day starts at 18:30 UTC."""
    clock = FakeClock(datetime(2026, 12, 3, 18, 29, 58, tzinfo=UTC).timestamp())
    cfg = {
        "tenants": [tenant("acme", quotas=[{"requests": 2, "per": "day", "timezone": "Asia/Kolkata"}])],
        "state": {"store": redis_server.url, "timeout_s": 1.0},
    }
    async with tenancy_stack(cfg, wall_clock=clock) as s:
        statuses = [(await s.client.post("/v1/chat/completions", json=chat("hi"), headers=auth("acme")))
                    for _ in range(3)]  # fmt: skip
        assert [r.status_code for r in statuses] == [200, 200, 429]
        assert (
            statuses[2].headers["retry-after"] == "2" and statuses[2].headers["x-kvgate-quota-reset"] == "2"
        )
        assert "resets at 2026-12-04T00:00:00+05:30" in statuses[2].text
        clock.now += 2  # 18:30:00 UTC: midnight in Kolkata
        r = await s.client.post("/v1/chat/completions", json=chat("hi"), headers=auth("acme"))
        assert r.status_code == 200 and r.headers["x-kvgate-quota-remaining"] == "1"
        raw = aioredis.Redis.from_url(redis_server.url)
        try:
            keys = sorted(k.decode() for k in await raw.keys("kvgate:{acme}:q:*"))
            assert keys == ["kvgate:{acme}:q:t:requests-per-day:2026-12-03",
                            "kvgate:{acme}:q:t:requests-per-day:2026-12-04"]  # fmt: skip
            # each counter lives until its window's end + one hour of grace (by the gateway's clock)
            ttl = await raw.pttl("kvgate:{acme}:q:t:requests-per-day:2026-12-04")
            assert 24 * 3600_000 < ttl <= 25 * 3600_000
        finally:
            await raw.aclose()


async def test_api_changes_survive_a_restart_through_redis(redis_server: RedisServer) -> None:  # noqa: F811
    cfg = {
        "tenants": [tenant("acme", limits={"rpm": 600})],
        "state": {"store": redis_server.url, "timeout_s": 1.0},
    }
    async with tenancy_stack(cfg) as s:
        made = (await s.client.post("/admin/tenants/acme/keys", json={"name": "svc"}, headers=ADMIN)).json()
        r = await s.client.patch("/admin/tenants/acme", json={"limits": {"rpm": 7}}, headers=ADMIN)
        assert r.status_code == 200
        assert (
            await s.client.delete("/admin/tenants/acme/keys/" + r.json()["keys"][0]["name"], headers=ADMIN)
        ).status_code == 200  # the config's unnamed key
    async with tenancy_stack(cfg) as s:  # a new gateway process's worth of state, the same Redis
        key = {"authorization": f"Bearer {made['key']}"}
        r = await s.client.post("/v1/chat/completions", json=chat("hi"), headers=key)
        assert r.status_code == 200 and r.headers["x-ratelimit-limit-requests"] == "7"
        r = await s.client.post("/v1/chat/completions", json=chat("hi"), headers=auth("acme"))
        assert r.status_code == 401  # revoked through the API, though the config lists it
        status = (await s.client.get("/admin/tenants/acme", headers=ADMIN)).json()
        assert status["overrides"]["limits"] == {"rpm": 7} and [k["name"] for k in status["keys"]] == ["svc"]
