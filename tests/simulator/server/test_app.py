"""The replica's non-generation routes, over loopback HTTP, against vLLM's captured shapes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from simulator.fleet import SimFleet
from tests.simulator.scrape import scrape, value
from tests.vllm_fixtures import VLLM_FIXTURES

FIXTURES = VLLM_FIXTURES


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with SimFleet(profile="tiny", max_loras=2, adapters=("lora-a",)) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        yield client


async def test_health_version_and_unknown_routes(client: httpx.AsyncClient) -> None:
    health = await client.get("/health")
    assert (health.status_code, health.content) == (200, b"")
    assert (await client.get("/version")).json()["version"].startswith("0.32.0")
    assert (await client.get("/nope")).status_code == 404
    assert (await client.get("/v1/completions")).status_code == 405


async def test_models_list_base_and_adapters_like_vllm(client: httpx.AsyncClient) -> None:
    ours = (await client.get("/v1/models")).json()
    theirs = orjson.loads((FIXTURES / "models_with_adapters.json").read_bytes())
    assert [m["id"] for m in ours["data"]] == ["tiny-llama", "lora-a"]
    assert [m["parent"] for m in ours["data"]] == [None, "tiny-llama"]
    assert ours["data"][0]["max_model_len"] == 4096
    assert set(ours["data"][0]) == set(theirs["data"][0])
    assert set(ours["data"][1]["permission"][0]) == set(theirs["data"][1]["permission"][0])


async def test_lora_load_and_unload(client: httpx.AsyncClient) -> None:
    loaded = await client.post("/v1/load_lora_adapter", json={"lora_name": "lora-b", "lora_path": "/x/b"})
    assert loaded.status_code == 200
    assert loaded.headers["content-type"].startswith("text/plain")
    assert "lora-b" in loaded.text
    again = await client.post("/v1/load_lora_adapter", json={"lora_name": "lora-b", "lora_path": "/x/b"})
    assert again.status_code == 400
    assert again.json()["error"]["message"] == "The lora adapter 'lora-b' has already been loaded."
    models = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
    assert models == ["tiny-llama", "lora-a", "lora-b"]
    served = await client.post("/v1/completions", json={"model": "lora-b", "prompt": "x", "max_tokens": 2})
    assert served.json()["model"] == "lora-b"
    assert (await client.post("/v1/unload_lora_adapter", json={"lora_name": "lora-b"})).status_code == 200
    missing = await client.post("/v1/unload_lora_adapter", json={"lora_name": "lora-b"})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "The lora adapter 'lora-b' cannot be found."
    gone = await client.post("/v1/completions", json={"model": "lora-b", "prompt": "x"})
    assert gone.status_code == 404
    incomplete = await client.post("/v1/load_lora_adapter", json={"lora_name": "c"})
    assert incomplete.status_code == 400


async def test_lora_load_needs_lora_enabled() -> None:
    async with SimFleet(profile="tiny") as fleet, httpx.AsyncClient(base_url=fleet.urls[0]) as client:
        response = await client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/a"})
        assert response.status_code == 400
        assert "vllm:lora_requests_info" not in await scrape(client)


async def test_tokenize_and_detokenize(client: httpx.AsyncClient) -> None:
    tokens = (await client.post("/tokenize", json={"prompt": "Hello, world!"})).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0
    assert tokens["max_model_len"] == 4096
    text = (await client.post("/detokenize", json={"tokens": tokens["tokens"]})).json()
    assert text == {"prompt": "Hello, world!"}
    chat = (await client.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]})).json()
    assert chat["count"] > 1
    assert (await client.post("/detokenize", json={"tokens": [-5]})).status_code == 400
    assert (await client.post("/detokenize", json={"tokens": "x"})).status_code == 400
    assert (await client.post("/tokenize", json={"prompt": "x", "model": "nope"})).status_code == 404
    assert (await client.post("/tokenize", content=b"{")).status_code == 400


async def test_reset_prefix_cache_forgets_cached_blocks(client: httpx.AsyncClient) -> None:
    prompt = {"prompt": "shared prefix " * 100, "max_tokens": 1}
    await client.post("/v1/completions", json=prompt)
    assert (await client.post("/reset_prefix_cache")).status_code == 200
    again = (await client.post("/v1/completions", json=prompt)).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_metrics_carry_every_vllm_name_and_cache_config(client: httpx.AsyncClient) -> None:
    await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "model": "lora-a"})
    samples = await scrape(client)
    for name in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
        "vllm:prompt_tokens_created", "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
        "vllm:request_queue_time_seconds_bucket", "vllm:cache_config_info", "vllm:lora_requests_info",
        "kvgate_sim_time_scale", "kvgate_sim_step_lag_seconds_bucket",
    ):
        assert name in samples, name
    assert value(samples, "vllm:generation_tokens_total", model_name="tiny-llama", engine="0") == 3
    assert value(samples, "vllm:request_success_total", finished_reason="length") == 1
    assert value(samples, "vllm:inter_token_latency_seconds_count") == 2
    cache = samples["vllm:cache_config_info"][0].labels
    assert (cache["block_size"], cache["enable_prefix_caching"], cache["engine"]) == ("16", "True", "0")
    assert int(cache["num_gpu_blocks"]) > 0
    assert "model_name" not in cache


async def test_sim_stats(client: httpx.AsyncClient) -> None:
    stats = (await client.get("/sim/stats")).json()
    assert stats["num_running"] == 0
    assert stats["block_size"] == 16
