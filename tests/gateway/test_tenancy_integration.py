"""Tenants over real loopback HTTP with the simulated fleet: keys, allow-lists, headers, 429s, the
admin API, a TPM limit under 200 concurrent requests, and priority bands under saturation."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import orjson
import pytest

from gateway.tokenizers import SimTokenizer
from tests.gateway.stack import MODEL, chat, metric_value, wait_for
from tests.gateway.tenancy_stack import ADMIN_KEY, auth, key_of, tenancy_stack, tenant

ACME = tenant(
    "acme",
    limits={"rpm": 120, "tpm": 6000, "max_output_tokens": 50},
    models=[MODEL],
)
LIMITED = {"tenants": [ACME, tenant("free", models=["other-model"])]}


def assert_openai_error(r: httpx.Response, status: int, type_: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == type_ and isinstance(err["message"], str) and err["message"]
    assert set(err) == {"message", "type", "param", "code"}
    return dict(err)


async def test_keys_allow_lists_and_priority_header_errors() -> None:
    async with tenancy_stack(LIMITED) as s:
        c = s.client
        r = await c.post("/v1/chat/completions", json=chat("hi"))
        assert "Bearer" in assert_openai_error(r, 401, "authentication_error")["message"]
        r = await c.post("/v1/chat/completions", json=chat("hi"), headers={"authorization": "Bearer nope"})
        err = assert_openai_error(r, 401, "authentication_error")
        assert "nope" not in err["message"]  # a presented key is never echoed
        r = await c.post("/v1/chat/completions", json=chat("hi"), headers={"authorization": "Basic abc"})
        assert_openai_error(r, 401, "authentication_error")
        r = await c.post("/v1/chat/completions", json=chat("hi"), headers=auth("free"))
        assert assert_openai_error(r, 403, "permission_error")["param"] == "model"
        r = await c.post(
            "/v1/chat/completions", json=chat("hi"), headers={**auth("acme"), "x-kvgate-priority": "urgent"}
        )
        assert assert_openai_error(r, 400, "invalid_request_error")["param"] == "x-kvgate-priority"
        r = await c.post("/v1/chat/completions", json=chat("hi"), headers=auth("acme"))
        assert r.status_code == 200
        text = (await c.get("/metrics")).text
        assert key_of("acme") not in text and "sha256" not in text
        assert await metric_value(c, "kvgate_rejections_total", {"reason": "unauthenticated"}) == 3
        assert await metric_value(c, "kvgate_rejections_total", {"tenant": "free"}) == 1


async def test_anonymous_tenant_and_open_gateway() -> None:
    cfg = {**LIMITED, "auth": {"anonymous_tenant": "acme"}}
    async with tenancy_stack(cfg) as s:
        r = await s.client.post("/v1/chat/completions", json=chat("hi"))
        assert r.status_code == 200 and r.headers["x-ratelimit-limit-requests"] == "120"
        r = await s.client.post(
            "/v1/chat/completions", json=chat("hi"), headers={"authorization": "Bearer x"}
        )
        assert r.status_code == 401  # a wrong key is not quietly downgraded to anonymous
    async with tenancy_stack({}) as s:  # no tenants: any key or none, no limits, no headers
        for headers in ({}, {"authorization": "Bearer none"}):
            r = await s.client.post("/v1/chat/completions", json=chat("hi"), headers=headers)
            assert r.status_code == 200
            assert not any(k.startswith("x-ratelimit") for k in r.headers)


async def test_ratelimit_headers_on_unary_and_streamed_answers() -> None:
    async with tenancy_stack(LIMITED) as s:
        prompt = chat("count my tokens please", max_tokens=20)
        p = len(SimTokenizer().encode_chat(prompt["messages"]))
        r = await s.client.post("/v1/chat/completions", json=prompt, headers=auth("acme"))
        h = r.headers
        assert h["x-ratelimit-limit-requests"] == "120" and h["x-ratelimit-remaining-requests"] == "119"
        assert h["x-ratelimit-limit-tokens"] == "6000"
        assert h["x-ratelimit-remaining-tokens"] == str(6000 - (p + 20))  # reserved: prompt + max_tokens
        assert h["x-ratelimit-reset-requests"] == "500ms"  # one request back at 2 per second
        assert h["x-ratelimit-reset-tokens"].endswith("ms") or h["x-ratelimit-reset-tokens"].endswith("s")
        body = chat("stream it", max_tokens=5, stream=True)
        async with s.client.stream("POST", "/v1/chat/completions", json=body, headers=auth("acme")) as r:
            assert r.status_code == 200 and "x-ratelimit-remaining-tokens" in r.headers
            assert int(r.headers["x-ratelimit-remaining-requests"]) <= 119
            await r.aread()


async def test_429_names_the_limit_and_retry_after_comes_from_the_refill() -> None:
    # Slow refills (one request per 10 s, one token per second): however loaded the machine, the
    # buckets cannot refill enough between two requests to change the outcome.
    cfg = {
        "tenants": [
            tenant("req", limits={"rpm": 6, "rpm_burst": 2}),
            tenant("tok", limits={"tpm": 60, "tpm_burst": 600}),
        ]
    }
    async with tenancy_stack(cfg) as s:
        for _ in range(2):
            assert (
                await s.client.post("/v1/chat/completions", json=chat("a"), headers=auth("req"))
            ).is_success
        r = await s.client.post("/v1/chat/completions", json=chat("a"), headers=auth("req"))
        err = assert_openai_error(r, 429, "rate_limit_error")
        assert err["code"] == "rate_limit_exceeded"
        assert "requests per minute (RPM)" in err["message"]
        assert "limit 6 per minute (bucket holds 2)" in err["message"]
        assert r.headers["x-ratelimit-remaining-requests"] == "0"
        reset_s = float(r.headers["x-ratelimit-reset-requests"].removesuffix("s"))  # e.g. "19.6s"
        retry = int(r.headers["retry-after"])  # one request back: at most 10 s at 6 per minute
        assert 1 <= retry <= 10 and retry <= reset_s + 1
        assert str(retry) in err["message"]

        ok = await s.client.post("/v1/chat/completions", json=chat("b", max_tokens=400), headers=auth("tok"))
        assert ok.is_success and "x-ratelimit-limit-requests" not in ok.headers  # no requests limit
        r = await s.client.post("/v1/chat/completions", json=chat("c", max_tokens=300), headers=auth("tok"))
        err = assert_openai_error(r, 429, "rate_limit_error")
        assert "tokens per minute (TPM)" in err["message"] and "RPM" not in err["message"]
        left = int(r.headers["x-ratelimit-remaining-tokens"])
        requested = int(err["message"].split("requested ")[1].split(".")[0])
        expected = requested - left  # seconds at one token per second
        assert int(r.headers["retry-after"]) in (expected - 1, expected)  # the header floors the level
        r = await s.client.post("/v1/chat/completions", json=chat("d", max_tokens=900), headers=auth("tok"))
        err = assert_openai_error(r, 400, "invalid_request_error")
        assert err["code"] == "request_too_large" and "retry-after" not in r.headers
        assert await metric_value(s.client, "kvgate_rejections_total", {"reason": "too_large"}) == 1
        assert await metric_value(s.client, "kvgate_rejections_total", {"reason": "rate_limit_tokens"}) == 1


async def test_admin_api_is_guarded_and_reports_buckets_and_usage() -> None:
    async with tenancy_stack(LIMITED) as s:
        c = s.client
        r = await c.post("/v1/chat/completions", json=chat("hello", max_tokens=9), headers=auth("acme"))
        usage = r.json()["usage"]
        assert_openai_error(await c.get("/admin/tenants"), 401, "authentication_error")
        r = await c.get("/admin/tenants", headers={"authorization": "Bearer wrong"})
        assert_openai_error(r, 401, "authentication_error")
        assert_openai_error(await c.get("/admin/tenants", headers=auth("acme")), 403, "permission_error")
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        listed = (await c.get("/admin/tenants", headers=admin)).json()
        assert [t["name"] for t in listed["data"]] == ["acme", "free"]
        one = (await c.get("/admin/tenants/acme", headers=admin)).json()
        assert one["used"]["requests"] == 1 and one["used"]["tokens"] == usage["total_tokens"]
        assert one["in_flight"] == 0 and one["limits"]["tpm"] == 6000
        tokens = one["buckets"]["tokens"]
        assert tokens["capacity"] == 6000
        assert 6000 - usage["total_tokens"] <= tokens["level"] <= 6000
        assert one["store"] == "memory"
        assert_openai_error(await c.get("/admin/tenants/nobody", headers=admin), 404, "not_found_error")
        assert ADMIN_KEY not in (await c.get("/metrics")).text
    async with tenancy_stack({"tenants": [ACME], "auth": {"admin_keys": []}}) as s:
        r = await s.client.get("/admin/tenants", headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert "disabled" in assert_openai_error(r, 403, "permission_error")["message"]


async def test_200_concurrent_requests_hold_the_tpm_limit_and_settle_to_the_real_usage() -> None:
    """A third streamed, a third unary, a third streamed from a replica that stalls after K chunks
    and then left by the client. The tokens bucket refills 1/60 token per second, so over the test
    it moves by well under one token: its level must equal capacity minus what was really used."""
    k = 4
    text = "Please summarise the quarterly numbers for the board."
    capacity = 1800
    cfg = {"tenants": [tenant("acme", limits={"tpm": 1, "tpm_burst": capacity})]}
    async with tenancy_stack(cfg, hang_after_chunks=k) as s:
        prompt = chat(text, max_tokens=16)
        p = len(SimTokenizer().encode_chat(prompt["messages"]))
        reservation = p + 16
        decided = asyncio.Event()
        statuses: list[int] = []
        charged: list[int] = []

        async def one(i: int) -> None:
            kind = i % 3
            if kind == 1:
                r = await s.client.post("/v1/chat/completions", json=prompt, headers=auth("acme"))
                statuses.append(r.status_code)
                if r.status_code == 200:
                    u = r.json()["usage"]
                    charged.append(u["prompt_tokens"] + u["completion_tokens"])
                return
            model = MODEL if kind == 0 else "hang-llama"
            body = {**prompt, "model": model, "stream": True, "stream_options": {"include_usage": True}}
            async with s.client.stream("POST", "/v1/chat/completions", json=body, headers=auth("acme")) as r:
                statuses.append(r.status_code)
                if r.status_code != 200:
                    await r.aread()
                    return
                events = []
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line)
                        if kind == 2 and len(events) == k:
                            break  # the replica stalls here: leave once everyone has been decided
                if kind == 0:
                    u = orjson.loads(events[-2][6:])["usage"]
                    charged.append(u["prompt_tokens"] + u["completion_tokens"])
                    return
                await decided.wait()
                charged.append(p + k)  # documented estimate: prompt + SSE events relayed

        started = time.monotonic()
        tasks = [asyncio.ensure_future(one(i)) for i in range(200)]
        async with asyncio.timeout(60):
            while len(statuses) < 200:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            decided.set()
            await asyncio.gather(*tasks)
        gw = s.gateway
        await wait_for(lambda: gw.tenancy.in_flight.get("acme", 0) == 0)
        assert gw.tenancy.admission is not None and gw.tenancy.admission.in_flight_of("acme") == 0
        elapsed = time.monotonic() - started
        admitted = statuses.count(200)
        assert statuses.count(429) == 200 - admitted
        assert admitted * reservation <= capacity + reservation  # never more than the limit + one
        assert admitted >= capacity // reservation - 1  # and the limit was really used
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        status = (await s.client.get("/admin/tenants/acme", headers=admin)).json()
        level = status["buckets"]["tokens"]["level"]
        expected = capacity - sum(charged)
        assert len(charged) == admitted
        assert expected <= level <= expected + (elapsed + 1) / 60 + 1e-6, (level, expected)
        assert status["used"]["tokens"] == sum(charged)


async def test_sheddable_is_refused_at_once_and_critical_goes_first_under_saturation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kvgate.access")
    cfg = {
        "tenants": [tenant("ops", priority="critical", limits={"rpm": 60, "tpm": 1_000_000})],
        "flow_control": {"saturation": {"max_in_flight_per_replica": 1, "max_waiting_per_replica": 4}},
    }
    async with tenancy_stack(cfg, replicas=1, time_scale=4.0) as s:
        done: list[str] = []

        async def send(label: str, band: str, max_tokens: int = 30) -> int:
            headers = {**auth("ops"), "x-kvgate-priority": band}
            body = chat(f"{label} " * 20, max_tokens=max_tokens)
            r = await s.client.post("/v1/chat/completions", json=body, headers=headers)
            done.append(label)
            return r.status_code

        running = asyncio.ensure_future(send("long", "standard", max_tokens=120))
        await wait_for(lambda: s.gateway.fleet.snapshot().replicas[0].in_flight == 1)
        queued = [asyncio.ensure_future(send(f"std{i}", "standard")) for i in range(2)]
        await wait_for(lambda: s.gateway.tenancy.admission.depth == 2)
        r = await s.client.post(
            "/v1/chat/completions",
            json=chat("shed me"),
            headers={**auth("ops"), "x-kvgate-priority": "sheddable"},
        )
        # Refused at once, not after a wait: nothing ahead of it has finished yet (an ordering, not
        # a wall-clock bound; the long answer takes over a second at this time scale).
        assert done == [] and s.gateway.fleet.snapshot().replicas[0].in_flight == 1
        err = assert_openai_error(r, 503, "overloaded_error")
        assert err["message"].startswith("fleet overloaded") and int(r.headers["retry-after"]) >= 1
        # The limits still come with the refusal, with this request's reservation given back.
        # (three requests admitted so far; the bucket refills 1 per second meanwhile)
        assert r.headers["x-ratelimit-limit-requests"] == "60"
        assert 60 - 3 <= int(r.headers["x-ratelimit-remaining-requests"]) < 60
        critical = asyncio.ensure_future(send("crit", "critical"))
        await wait_for(lambda: s.gateway.tenancy.admission.depth == 3)
        statuses = await asyncio.gather(running, *queued, critical)
        assert statuses == [200, 200, 200, 200]
        assert done == ["long", "crit", "std0", "std1"]
        assert await metric_value(s.client, "kvgate_rejections_total", {"reason": "shed"}) == 1
        assert await metric_value(s.client, "kvgate_admissions_total", {"path": "queued"}) == 3
        waited = await metric_value(s.client, "kvgate_queue_wait_seconds_count", {"outcome": "dispatched"})
        assert waited == 3
    # The access log's dispatch_ms counts the queue: a held request went out only after the running
    # one had its answer (its start + dispatch_ms is past the running one's first byte, which for a
    # non-streamed answer is its end). Within 5 ms: `ts` is logged to the millisecond, and the slot
    # frees when the replica's answer ends, which may dispatch the next request before the first
    # byte to the client is stamped; the hold itself is ~0.9 s.
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "kvgate.access"]
    assert len(lines) == 5

    def start(line: dict[str, Any]) -> float:
        return float(line["ts"]) - line["duration_ms"] / 1000

    long = next(line for line in lines if line["completion_tokens"] == 120)
    shed = next(line for line in lines if line["status"] == 503)
    assert shed["dispatch_ms"] is None and shed["replica"] is None
    held = [line for line in lines if line is not long and line is not shed]
    long_first_byte = start(long) + long["ttft_ms"] / 1000
    for line in held:
        assert 0 < line["dispatch_ms"] <= line["ttft_ms"]
        assert start(line) + line["dispatch_ms"] / 1000 > long_first_byte - 0.005
        assert line["dispatch_ms"] > 20  # held, not sent on arrival (that takes ~1 ms)


async def test_a_client_leaving_the_queue_and_a_request_refused_after_admission_get_everything_back() -> None:
    cfg = {
        "tenants": [tenant("acme", limits={"rpm": 1, "rpm_burst": 10, "tpm": 1, "tpm_burst": 5000})],
        "flow_control": {"saturation": {"max_in_flight_per_replica": 1, "max_waiting_per_replica": 4}},
    }
    async with tenancy_stack(cfg, replicas=1, time_scale=4.0) as s:
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}

        async def levels() -> tuple[float, float]:
            b = (await s.client.get("/admin/tenants/acme", headers=admin)).json()["buckets"]
            return b["requests"]["level"], b["tokens"]["level"]

        running = asyncio.ensure_future(
            s.client.post(
                "/v1/chat/completions", json=chat("long " * 10, max_tokens=60), headers=auth("acme")
            )
        )
        await wait_for(lambda: s.gateway.fleet.snapshot().replicas[0].in_flight == 1)
        req_before, tok_before = await levels()
        leaver = asyncio.ensure_future(
            s.client.post("/v1/chat/completions", json=chat("leave me", max_tokens=100), headers=auth("acme"))
        )
        await wait_for(lambda: s.gateway.tenancy.admission.depth == 1)
        assert (await levels())[1] < tok_before - 100  # reserved while it waits
        leaver.cancel()  # the client hangs up while queued
        await asyncio.gather(leaver, return_exceptions=True)
        await wait_for(lambda: s.gateway.tenancy.admission.depth == 0)
        await wait_for(lambda: s.gateway.tenancy.in_flight.get("acme", 0) == 1)
        req_after, tok_after = await levels()
        assert req_after >= req_before and tok_before <= tok_after <= tok_before + 1  # all given back
        assert (await running).status_code == 200
        await wait_for(lambda: s.gateway.tenancy.in_flight.get("acme", 0) == 0)

        # the replica dies: kvgate refuses after admission (no replica), and charges nothing
        await s.fleet.stop_replica(0)
        await wait_for(lambda: not s.gateway.fleet.snapshot().replicas[0].healthy)
        req_before, tok_before = await levels()
        r = await s.client.post("/v1/chat/completions", json=chat("anyone?"), headers=auth("acme"))
        assert r.status_code in (502, 503) and "x-ratelimit-limit-tokens" in r.headers
        await wait_for(lambda: s.gateway.tenancy.in_flight.get("acme", 0) == 0)
        admission = s.gateway.tenancy.admission
        assert admission is not None and admission.in_flight_of("acme") == 0  # the fair share too
        req_after, tok_after = await levels()
        assert req_before <= req_after <= req_before + 1 and tok_before <= tok_after <= tok_before + 1
        used = (await s.client.get("/admin/tenants/acme", headers=admin)).json()["used"]
        assert used["requests"] == 1  # only the long request was charged


async def test_pass_priority_sends_the_band_to_vllm_and_metrics_are_exposed() -> None:
    cfg = {
        "tenants": [tenant("ops", priority="standard", limits={"rpm": 100})],
        "flow_control": {"pass_priority": True},
    }
    async with tenancy_stack(cfg, replicas=1, scheduling_policy="priority") as s:
        for band in ("standard", "sheddable"):
            body = chat("hi", priority=-5)  # the client's own priority never reaches the engine
            r = await s.client.post(
                "/v1/chat/completions", json=body, headers={**auth("ops"), "x-kvgate-priority": band}
            )
            assert r.status_code == 200, r.text
        text = (await s.client.get("/metrics")).text
        for family in (
            "kvgate_queue_depth",
            "kvgate_tenant_bucket_level",
            "kvgate_tenant_in_flight",
            "kvgate_state_store_up",
            "kvgate_admissions_total",
        ):
            assert family in text, family
    async with tenancy_stack(cfg, replicas=1) as s:  # a replica without priority scheduling refuses it
        r = await s.client.post("/v1/chat/completions", json=chat("hi"), headers=auth("ops"))
        assert r.status_code == 400 and "Priority scheduling is not enabled" in r.json()["error"]["message"]


async def test_max_output_tokens_is_a_limit_the_replica_cannot_exceed() -> None:
    async with tenancy_stack(LIMITED) as s:
        c = s.client
        r = await c.post(
            "/v1/chat/completions", json=chat("too long please", max_tokens=51), headers=auth("acme")
        )
        err = assert_openai_error(r, 400, "invalid_request_error")
        assert err["param"] == "max_tokens" and "50" in err["message"]
        # no max_tokens: kvgate sets the tenant's cap, so the answer stops at what was reserved
        body = {"model": MODEL, "messages": [{"role": "user", "content": "go on"}]}
        r = await c.post("/v1/chat/completions", json=body, headers=auth("acme"))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 50
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with c.stream("POST", "/v1/chat/completions", json=stream, headers=auth("acme")) as r:
            events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        assert orjson.loads(events[-2][6:])["usage"]["completion_tokens"] == 50


async def test_a_gateway_bug_is_an_openai_500_and_the_reservation_comes_back() -> None:
    """A fault inside kvgate itself (here: routing raises) must not crash the request path, leak the
    tenant's reservation or its in-flight slot."""
    async with tenancy_stack(LIMITED) as s:
        c = s.client
        router = s.gateway.router
        real = router.decide

        def broken(*args: Any, **kw: Any) -> Any:
            raise RuntimeError("injected fault")

        router.decide = broken
        try:
            r = await c.post("/v1/chat/completions", json=chat("boom", max_tokens=20), headers=auth("acme"))
        finally:
            router.decide = real
        err = assert_openai_error(r, 500, "internal_error")
        assert "injected" not in err["message"]  # internals are logged, not shown
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        status = (await c.get("/admin/tenants/acme", headers=admin)).json()
        assert status["in_flight"] == 0
        assert status["buckets"]["tokens"]["level"] >= 6000 - 1e-6  # nothing charged
        r = await c.post("/v1/chat/completions", json=chat("fine", max_tokens=5), headers=auth("acme"))
        assert r.status_code == 200


async def test_a_batch_of_prompts_reserves_every_completion_it_asks_for() -> None:
    # vLLM runs one completion per prompt of a batch: 8 prompts reserve 8 x (prompt + max_tokens).
    # One token per second of refill: nothing the test waits for changes the bucket enough to matter.
    cfg = {"tenants": [tenant("batch", limits={"tpm": 60, "tpm_burst": 1000})]}
    prompt = "The batch prompt, one of several the client sends at once."
    prompt_tokens = len(SimTokenizer().encode_prompt(prompt))
    one = {"model": MODEL, "prompt": prompt, "max_tokens": 90}
    async with tenancy_stack(cfg) as s:
        c = s.client
        big = {"model": MODEL, "prompt": "word " * 400, "max_tokens": 50}  # about half the bucket
        assert (await c.post("/v1/completions", json=big, headers=auth("batch"))).is_success
        r = await c.post("/v1/completions", json={**one, "prompt": [prompt] * 8}, headers=auth("batch"))
        err = assert_openai_error(r, 429, "rate_limit_error")
        assert f"requested {8 * (prompt_tokens + 90)}." in err["message"]
        r = await c.post("/v1/completions", json=one, headers=auth("batch"))
        assert r.status_code == 200, r.text
