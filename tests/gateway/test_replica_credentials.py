"""Over real HTTP: kvgate in front of simulated replicas that demand an API key (`vllm serve
--api-key`), tenants with their own keys; request ids end to end; one access log line per request."""

from __future__ import annotations

import asyncio
import logging

import httpx
import orjson
import pytest

from tests.gateway.scripted_replica import Scripted, scripted, serves_vllm, unary
from tests.gateway.stack import MODEL, chat, stack
from tests.gateway.tenancy_stack import auth, tenant
from tests.gateway.test_failover import gateway_over
from tests.vllm_fixtures import VLLM_FIXTURES

REPLICA_KEY = "replica-secret-7f3a"
TENANTS = {"tenants": [tenant("acme")]}


async def test_replicas_behind_an_api_key_are_scraped_and_served_with_the_pool_s_credential(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVGATE_TEST_REPLICA_KEY", REPLICA_KEY)
    cfg = {**TENANTS, "models": [{"name": MODEL, "api_key_env": "KVGATE_TEST_REPLICA_KEY"}]}
    async with stack(config=cfg, api_key=REPLICA_KEY) as s:
        # /v1/models needs the key: the fleet's models come from there.
        assert MODEL in s.gateway.fleet.models().base_models
        r = await s.client.post("/v1/chat/completions", json=chat("hello"), headers=auth("acme"))
        assert r.status_code == 200, r.text
        async with s.client.stream(
            "POST", "/v1/chat/completions", json=chat("hello", stream=True), headers=auth("acme")
        ) as resp:
            body = b"".join([c async for c in resp.aiter_bytes()])
        assert resp.status_code == 200 and body.rstrip().endswith(b"data: [DONE]")


async def test_the_client_s_own_key_never_reaches_a_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scripted replica records the exact request head kvgate sends it."""
    monkeypatch.setenv("KVGATE_TEST_REPLICA_KEY", REPLICA_KEY)

    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter, state: Scripted) -> None:
        w.write(unary((VLLM_FIXTURES / "chat_nonstream.json").read_bytes()))
        await w.drain()

    cfg = {**TENANTS, "models": [{"name": MODEL, "api_key_env": "KVGATE_TEST_REPLICA_KEY"}]}
    async with (
        scripted(serves_vllm(answer)) as replica,
        gateway_over(replica.url, cfg) as server,
        httpx.AsyncClient(base_url=server.url) as client,
    ):
        r = await client.post("/v1/chat/completions", json=chat("hi"), headers=auth("acme"))
    assert r.status_code == 200
    head = replica.heads[0].lower()
    assert head.count(b"authorization:") == 1
    assert b"authorization: bearer " + REPLICA_KEY.encode() in head
    assert auth("acme")["authorization"].split()[1].encode().lower() not in head


async def test_request_ids_are_kept_or_made_and_returned_on_every_answer() -> None:
    async with stack(config=TENANTS) as s:
        r = await s.client.post(
            "/v1/chat/completions", json=chat("hi"), headers={**auth("acme"), "x-request-id": "trace-abc.1"}
        )
        assert r.status_code == 200 and r.headers["x-request-id"] == "trace-abc.1"
        r = await s.client.post("/v1/chat/completions", json=chat("hi"), headers=auth("acme"))
        made = r.headers["x-request-id"]
        r = await s.client.post("/v1/chat/completions", json=chat("hi"), headers=auth("acme"))
        assert made and r.headers["x-request-id"] != made
        # kvgate's own errors carry it too: unauthenticated, unknown model, bad JSON, wrong method.
        for resp in (
            await s.client.post("/v1/chat/completions", json=chat("hi"), headers={"x-request-id": "e1"}),
            await s.client.post(
                "/v1/chat/completions",
                json=chat("hi", model="nope"),
                headers={**auth("acme"), "x-request-id": "e2"},
            ),
            await s.client.post(
                "/v1/chat/completions", content=b"{", headers={**auth("acme"), "x-request-id": "e3"}
            ),
            await s.client.get("/v1/chat/completions", headers={"x-request-id": "e4"}),
        ):
            assert resp.status_code in (400, 401, 404, 405)
            assert resp.headers["x-request-id"].startswith("e")


async def test_one_access_log_line_per_request_without_keys_or_prompts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kvgate.access")
    secret_prompt = "my very private prompt text"
    async with stack(config=TENANTS) as s:
        await s.client.post(
            "/v1/chat/completions",
            json=chat(secret_prompt, max_tokens=5),
            headers={**auth("acme"), "x-request-id": "L1"},
        )
        async with s.client.stream(
            "POST",
            "/v1/chat/completions",
            json=chat(secret_prompt, stream=True),
            headers={**auth("acme"), "x-request-id": "L2"},
        ) as resp:
            [c async for c in resp.aiter_bytes()]
        await s.client.post("/v1/chat/completions", json=chat("x"), headers={"x-request-id": "L3"})
        for i in range(4):  # more streams: once the fleet's scrape is fresh, their predictions are scored
            async with s.client.stream(
                "POST", "/v1/chat/completions", json=chat(f"s{i}", stream=True),
                headers={**auth("acme"), "x-request-id": f"S{i}"},
            ) as resp:  # fmt: skip
                [c async for c in resp.aiter_bytes()]
        metrics = (await s.client.get("/metrics")).text
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "kvgate.access"]
    by_id = {line["request_id"]: line for line in lines}
    assert set(by_id) == {"L1", "L2", "L3", "S0", "S1", "S2", "S3"}
    one, two, three = by_id["L1"], by_id["L2"], by_id["L3"]
    assert one["tenant"] == "acme" and one["model"] == MODEL and one["pool"] == MODEL
    assert one["status"] == 200 and one["stream"] is False and one["replica"] in ("r0", "r1")
    assert one["completion_tokens"] == 5 and one["prompt_tokens"] > 0 and one["retries"] == 0
    assert 0 < one["dispatch_ms"] <= one["ttft_ms"] <= one["duration_ms"]
    assert two["stream"] is True and two["status"] == 200 and two["completion_tokens"] > 0
    assert three["status"] == 401 and three["tenant"] is None and three["replica"] is None
    assert three["dispatch_ms"] is None and three["ttft_ms"] is None  # never went out
    # The latency model's prediction for each request sent, its error for each stream it scored: the
    # observations of kvgate_ttft_prediction_error_ratio, one for one.
    assert one["predicted_ttft_ms"] > 0 and one["ttft_error"] is None  # no first chunk to score
    assert three["predicted_ttft_ms"] is None and three["ttft_error"] is None
    streams = [line for line in lines if line["stream"]]
    assert all(line["predicted_ttft_ms"] > 0 for line in streams)
    scored = [line["ttft_error"] for line in streams if line["ttft_error"] is not None]
    assert scored and all(e >= 0 for e in scored)
    count = sum(float(v) for k, v in _samples(metrics, "kvgate_ttft_prediction_error_ratio_count"))
    total = sum(float(v) for k, v in _samples(metrics, "kvgate_ttft_prediction_error_ratio_sum"))
    assert count == len(scored) and total == pytest.approx(sum(scored), abs=1e-3)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert secret_prompt not in text and "sk-test" not in text


def _samples(text: str, name: str) -> list[tuple[str, str]]:
    """(labels, value) of each sample of `name` on a /metrics page."""
    return [
        (line[len(name) :].rsplit(" ", 1)[0], line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    ]


async def test_the_access_log_can_be_turned_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kvgate.access")
    async with stack(config={"server": {"access_log": False}}) as s:
        assert (await s.client.post("/v1/chat/completions", json=chat("hi"))).status_code == 200
    assert not [r for r in caplog.records if r.name == "kvgate.access"]
