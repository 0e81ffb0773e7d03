"""A whole replica over loopback HTTP behaves like vLLM under the effects routing depends on:
prefix caching, KV pressure (queueing, preemption), LoRA adapter limits."""

from __future__ import annotations

import asyncio

import httpx

from simulator.fleet import SimFleet
from tests.simulator.scrape import metric, scrape, value


async def test_a_repeated_long_prompt_hits_the_prefix_cache() -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 200  # ~2,000 tokens
    async with SimFleet(profile="tiny") as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        first = (await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})).json()
        after_first = await scrape(client)
        second = (await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})).json()
        after_second = await scrape(client)

    prompt_tokens = first["usage"]["prompt_tokens"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert prompt_tokens - 16 <= cached < prompt_tokens  # every full block but the last token's
    hits = "vllm:prefix_cache_hits_total"
    assert value(after_first, hits) == 0
    assert value(after_second, hits) - value(after_first, hits) == cached
    queries = "vllm:prefix_cache_queries_total"
    assert value(after_second, queries) - value(after_first, queries) == prompt_tokens
    # The engine's modelled step time (deterministic; a reported TTFT also holds whatever the
    # simulated clock skipped when a loaded machine scheduled the simulator late): the second
    # request's step computes no prefill of the cached blocks.
    busy = "kvgate_sim_busy_wall_seconds_total"
    busy_first = value(after_first, busy)
    busy_second = value(after_second, busy) - busy_first
    assert 0 < busy_second < busy_first / 3


async def test_a_full_kv_cache_queues_and_preempts() -> None:
    async with SimFleet(profile="tiny", kv_blocks=64, time_scale=0.5) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=30) as client:
        prompt = "word " * 200  # distinct first blocks below: no prefix sharing between the requests
        waiting_seen = 0.0

        async def watch() -> None:
            nonlocal waiting_seen
            while True:
                waiting_seen = max(waiting_seen, await metric(client, "vllm:num_requests_waiting"))
                await asyncio.sleep(0.005)

        watcher = asyncio.ensure_future(watch())
        responses = await asyncio.gather(*(
            client.post("/v1/completions", json={"prompt": f"{i} {prompt}", "max_tokens": 150})
            for i in range(8)))
        watcher.cancel()
        assert [r.status_code for r in responses] == [200] * 8
        assert all(r.json()["usage"]["completion_tokens"] == 150 for r in responses)
        assert waiting_seen > 0
        assert await metric(client, "vllm:num_preemptions_total") > 0
        assert await metric(client, "vllm:kv_cache_usage_perc") == 0.0
        assert await metric(client, "vllm:request_success_total", finished_reason="length") == 8


async def test_max_loras_one_runs_one_adapter_at_a_time() -> None:
    fleet = SimFleet(profile="tiny", max_loras=1, adapters=("lora-a", "lora-b"), time_scale=0.5)
    async with fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=30) as client:
        responses = await asyncio.gather(*(
            client.post("/v1/completions", json={"model": name, "prompt": f"hi {i}", "max_tokens": 20})
            for i in range(4) for name in ("lora-a", "lora-b")))
        assert [r.status_code for r in responses] == [200] * 8
        assert {r.json()["model"] for r in responses} == {"lora-a", "lora-b"}
        series = (await scrape(client))["vllm:lora_requests_info"]
    running = {s.labels["running_lora_adapters"] for s in series}
    assert {"lora-a", "lora-b"} <= running
    assert all("," not in r for r in running)  # never both in one batch
    assert {s.labels["max_lora"] for s in series} == {"1"}
    newest = max(series, key=lambda s: s.value)
    assert newest.labels["running_lora_adapters"] == ""  # all done now
