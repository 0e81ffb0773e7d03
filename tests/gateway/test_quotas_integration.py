"""Quotas over real loopback HTTP with the simulated fleet, on the memory store, with an injected wall
clock: a day quota in Europe/Berlin holds under concurrent streams and resets at Berlin's midnight;
keys are sub-principals with their own limits and quotas; warnings come once."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest

from gateway.tokenizers import SimTokenizer
from tests.gateway.stack import MODEL, chat, metric_value
from tests.gateway.stores.fakes import FakeClock
from tests.gateway.tenancy_stack import ADMIN_KEY, auth, key_of, tenancy_stack, tenant

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


async def stream_usage(
    c: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]
) -> tuple[int, Any]:
    """(status, the response: usage for a 200 stream, the error and headers otherwise)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, r
        events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
    return 200, orjson.loads(events[-2][6:])["usage"]


async def test_a_day_quota_holds_under_concurrent_streams_and_resets_at_midnight_in_its_zone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(utc("2026-12-03T20:00:00"))  # 21:00 in Berlin; the day ends at 23:00 UTC
    prompt = chat("Summarise the quarterly numbers for the board, briefly.", max_tokens=16)
    p = len(SimTokenizer().encode_chat(prompt["messages"]))
    reservation = p + 16
    limit = 10 * reservation + reservation // 2
    quota = {"tokens": limit, "per": "day", "timezone": "Europe/Berlin", "warn_at": 0.5}
    cfg = {"tenants": [tenant("acme", quotas=[quota])]}
    caplog.set_level(logging.WARNING, logger="kvgate.quota")
    async with tenancy_stack(cfg, wall_clock=clock) as s:
        results = await asyncio.gather(*(stream_usage(s.client, prompt, auth("acme")) for _ in range(40)))
        ok = [u for status, u in results if status == 200]
        refused = [r for status, r in results if status != 200]
        charged = sum(u["prompt_tokens"] + u["completion_tokens"] for u in ok)
        assert len(ok) + len(refused) == 40 and all(r.status_code == 429 for r in refused)
        assert len(ok) * reservation <= limit + reservation  # never more than one reservation over
        assert charged <= limit + reservation
        assert len(ok) >= limit // reservation - 1  # and the quota was really used
        r = refused[0]
        err = r.json()["error"]
        assert err["type"] == "insufficient_quota" and err["code"] == "insufficient_quota"
        assert "'tokens-per-day' of tenant 'acme'" in err["message"]
        assert "resets at 2026-12-04T00:00:00+01:00" in err["message"]
        assert r.headers["retry-after"] == "10800"  # until Berlin's midnight, not a constant
        assert r.headers["x-kvgate-quota-name"] == "tokens-per-day"
        assert r.headers["x-kvgate-quota-limit"] == str(limit)
        assert r.headers["x-kvgate-quota-reset"] == "10800"
        assert int(r.headers["x-kvgate-quota-remaining"]) < reservation
        # the admin view: the quota's use is exactly what the replicas reported, and when it resets
        status = (await s.client.get("/admin/tenants/acme", headers=ADMIN)).json()
        (q,) = status["quotas"]
        assert q["used"] == charged and q["remaining"] == limit - charged
        assert q["window"]["label"] == "2026-12-03" and q["resets_at"] == "2026-12-04T00:00:00+01:00"
        assert q["reset_s"] == 10800 and q["source"] == "config"
        # the warning at 50 %: once, however many requests passed it
        assert await metric_value(s.client, "kvgate_quota_warnings_total", {"tenant": "acme"}) == 1
        warnings = [m for m in caplog.messages if "quota warning" in m]
        assert len(warnings) == 1 and "tenant 'acme'" in warnings[0] and "over 50%" in warnings[0]

        clock.now = utc("2026-12-03T22:59:59")  # one second before Berlin's midnight: still refused
        status_code, r = await stream_usage(s.client, prompt, auth("acme"))
        assert status_code == 429 and r.headers["retry-after"] == "1"
        clock.now = utc("2026-12-03T23:00:00")  # midnight in Berlin: a new window
        status_code, usage = await stream_usage(s.client, prompt, auth("acme"))
        assert status_code == 200
        r = await s.client.post("/v1/chat/completions", json=prompt, headers=auth("acme"))
        assert r.status_code == 200
        assert r.headers["x-kvgate-quota-remaining"] == str(
            limit - usage["prompt_tokens"] - usage["completion_tokens"] - reservation
        )
        assert r.headers["x-kvgate-quota-reset"] == str(24 * 3600)
        (q,) = (await s.client.get("/admin/tenants/acme", headers=ADMIN)).json()["quotas"]
        assert q["window"]["label"] == "2026-12-04"


async def test_keys_are_sub_principals_whose_limits_and_quotas_apply_with_the_tenants() -> None:
    clock = FakeClock(utc("2026-12-03T10:00:00"))
    cfg = {
        "tenants": [
            tenant(
                "acme",
                quotas=[{"requests": 5, "per": "day"}],
                keys=[
                    {"name": "ci-bot", "hash": _hash("sk-ci"), "quotas": [{"requests": 2, "per": "day"}]},
                    {"name": "slow", "hash": _hash("sk-slow"), "limits": {"rpm": 1, "rpm_burst": 1}},
                ],
            )
        ],
    }
    ci, slow = {"authorization": "Bearer sk-ci"}, {"authorization": "Bearer sk-slow"}
    async with tenancy_stack(cfg, wall_clock=clock) as s:
        c = s.client

        async def ask(headers: dict[str, str]) -> httpx.Response:
            return await c.post("/v1/chat/completions", json=chat("hi"), headers=headers)

        assert [(await ask(ci)).status_code for _ in range(2)] == [200, 200]
        r = await ask(ci)  # the key's own quota
        assert r.status_code == 429 and "'requests-per-day' of key 'ci-bot' of tenant 'acme'" in r.text
        assert r.headers["x-kvgate-quota-limit"] == "2"
        r = await ask(slow)
        assert r.status_code == 200 and r.headers["x-ratelimit-limit-requests"] == "1"
        r = await ask(slow)  # the key's own rate limit
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
        assert "key 'slow' of tenant 'acme'" in r.text
        # the unnamed key meets only the tenant's quota, which counts every key's requests: 2 + 1 + 2
        assert [(await ask(auth("acme"))).status_code for _ in range(2)] == [200, 200]
        r = await ask(auth("acme"))
        assert r.status_code == 429 and "'requests-per-day' of tenant 'acme'" in r.text
        # a refusal by the quota charges nothing: the rate-limited and refused requests are not counted
        status = (await c.get("/admin/tenants/acme", headers=ADMIN)).json()
        assert status["quotas"][0]["used"] == 5
        keys = {k["name"]: k for k in status["keys"]}
        assert set(keys) == {"ci-bot", "slow", "unnamed-" + _hash(key_of("acme"))[7:15]}
        assert keys["ci-bot"]["quotas"][0]["used"] == 2 and keys["ci-bot"]["source"] == "config"
        assert keys["slow"]["limits"]["rpm"] == 1
        text = (await c.get("/admin/tenants/acme/keys", headers=ADMIN)).text
        assert "sha256" not in text and "sk-ci" not in text


async def test_a_request_larger_than_a_whole_quota_is_a_400_and_model_patterns_scope_quotas() -> None:
    cfg = {
        "tenants": [
            tenant(
                "acme",
                quotas=[
                    {"tokens": 100, "per": "month", "models": ["tiny-*"]},
                    {"requests": 1, "per": "week", "models": ["other-*"]},  # never matches
                ],
            )
        ]
    }
    async with tenancy_stack(cfg) as s:
        r = await s.client.post("/v1/chat/completions", json=chat("hi", max_tokens=200), headers=auth("acme"))
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "request_too_large" and err["param"] == "max_tokens"
        assert "'tokens-per-month[tiny-*]'" in err["message"] and "retry-after" not in r.headers
        for _ in range(2):  # the requests-per-week quota is for other models
            r = await s.client.post(
                "/v1/chat/completions", json=chat("hi", max_tokens=4), headers=auth("acme")
            )
            assert r.status_code == 200 and r.headers["x-kvgate-quota-name"] == "tokens-per-month[tiny-*]"
        assert await metric_value(s.client, "kvgate_rejections_total", {"reason": "too_large"}) == 1


def _hash(key: str) -> str:
    from gateway.auth_keys import hash_key

    return hash_key(key)


assert MODEL == "tiny-llama"  # the model patterns above are written for it
