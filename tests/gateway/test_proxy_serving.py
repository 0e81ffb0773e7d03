"""Serving over real loopback HTTP: kvgate in front of simulated replicas."""

from __future__ import annotations

import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.stack import MODEL, chat, metric_value, stack


async def test_non_streaming_passes_the_replica_answer_and_records_usage() -> None:
    async with stack(replicas=2) as s:
        r = await s.client.post("/v1/chat/completions", json=chat("hello there " * 50, max_tokens=7))
        assert r.status_code == 200
        assert r.headers["x-kvgate-replica"] in {"r0", "r1"}
        body = r.json()
        assert body["object"] == "chat.completion"
        usage = body["usage"]
        assert usage["completion_tokens"] == 7
        prompt = await metric_value(s.client, "kvgate_tokens_total", {"kind": "prompt", "model": MODEL})
        completion = await metric_value(s.client, "kvgate_tokens_total", {"kind": "completion"})
        assert prompt == usage["prompt_tokens"] and completion == 7


async def test_streaming_strips_usage_it_asked_for_but_still_records_it() -> None:
    async with stack(replicas=1) as s:
        req = chat("stream me " * 40, max_tokens=5, stream=True)
        async with s.client.stream("POST", "/v1/chat/completions", json=req) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        chunks = [orjson.loads(e[6:]) for e in events[:-1]]
        assert all("usage" not in c or c["usage"] is None for c in chunks)
        assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) == 5
        assert await metric_value(s.client, "kvgate_tokens_total", {"kind": "completion"}) == 5
        assert await metric_value(s.client, "kvgate_tokens_total", {"kind": "prompt"}) > 0


async def test_streaming_keeps_usage_when_the_client_asked() -> None:
    async with stack(replicas=1) as s:
        req = chat("x " * 10, max_tokens=3, stream=True, stream_options={"include_usage": True})
        async with s.client.stream("POST", "/v1/chat/completions", json=req) as r:
            events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        usage_chunk = orjson.loads(events[-2][6:])
        assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 3


async def test_completions_endpoint_streams_and_counts_cached_tokens() -> None:
    async with stack(replicas=1) as s:
        prompt = "The quick brown fox jumps over the lazy dog. " * 60
        for _ in range(2):
            r = await s.client.post(
                "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2}
            )
            assert r.status_code == 200 and r.json()["object"] == "text_completion"
        cached = await metric_value(s.client, "kvgate_tokens_total", {"kind": "cached"})
        assert cached > 0  # the second request hit the replica's prefix cache


async def test_models_health_ready_and_metrics_names() -> None:
    async with stack(replicas=2, max_loras=2, adapters=("sql-lora",)) as s:
        assert (await s.client.get("/health")).status_code == 200
        ready = await s.client.get("/ready")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        from tests.gateway.stack import wait_for

        await wait_for(lambda: "sql-lora" in s.gateway.fleet.models().adapters)
        models = (await s.client.get("/v1/models")).json()
        ids = {m["id"]: m["parent"] for m in models["data"]}
        assert ids == {MODEL: None, "sql-lora": MODEL}
        await s.client.post("/v1/chat/completions", json=chat("hi", max_tokens=2))
        text = (await s.client.get("/metrics")).text
        names = {f.name for f in text_string_to_metric_families(text)}
        for name in (
            "kvgate_requests",
            "kvgate_time_to_first_token_seconds",
            "kvgate_inter_chunk_latency_seconds",
            "kvgate_tokens",
            "kvgate_routing_decisions",
            "kvgate_prefix_match_ratio",
            "kvgate_retries",
            "kvgate_upstream_errors",
            "kvgate_replica_scrape_age_seconds",
            "kvgate_prefix_index_keys",
            "kvgate_scheduling_decision_seconds",
        ):
            assert name in names, name


async def test_adapter_request_goes_to_the_base_pool() -> None:
    async with stack(replicas=1, max_loras=1, adapters=("sql-lora",)) as s:
        from tests.gateway.stack import wait_for

        await wait_for(lambda: s.gateway.fleet.pool_of("sql-lora") is not None)
        r = await s.client.post("/v1/chat/completions", json=chat("select", max_tokens=2, model="sql-lora"))
        assert r.status_code == 200 and r.json()["model"] == "sql-lora"


async def test_inter_chunk_latency_is_recorded_for_the_model_as_streams_go() -> None:
    async with stack(replicas=1, time_scale=5.0) as s:
        req = chat("pace me " * 10, max_tokens=6, stream=True)
        async with s.client.stream("POST", "/v1/chat/completions", json=req) as r:
            events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        labels = {"model": MODEL}
        count = await metric_value(s.client, "kvgate_inter_chunk_latency_seconds_count", labels)
        total = await metric_value(s.client, "kvgate_inter_chunk_latency_seconds_sum", labels)
        # A gap between each two chunks relayed; events that arrive from the replica together are
        # relayed as one chunk, so there are at most as many gaps as events after the first.
        assert 1 <= count <= len(events) - 1 and total > 0
