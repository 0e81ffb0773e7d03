"""The generation routes over real loopback HTTP: shapes, usage, stop strings, errors, disconnects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from simulator.fleet import SimFleet
from tests.simulator.scrape import eventually, metric

CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Say something."}]}


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with SimFleet(replicas=1, profile="tiny") as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        yield client


def sse_events(text: str) -> list[str]:
    assert text.endswith("\n\n")
    blocks = text.split("\n\n")[:-1]
    assert all(b.startswith("data: ") for b in blocks)
    return [b[len("data: "):] for b in blocks]


async def test_chat_non_streaming(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == "tiny-llama"
    choice = body["choices"][0]
    assert (choice["finish_reason"], choice["message"]["role"]) == ("length", "assistant")
    usage = body["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    tokenized = (await client.post("/tokenize", json={"messages": CHAT["messages"]})).json()
    assert usage["prompt_tokens"] == tokenized["count"]
    detok = (await client.post("/tokenize", json={"prompt": choice["message"]["content"]})).json()
    assert detok["count"] == 5  # the filler text is one token per word


async def test_default_max_tokens_is_16(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/completions", json={"prompt": "Once upon a time"})).json()
    assert body["usage"]["completion_tokens"] == 16
    assert body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] == "length"


async def test_max_completion_tokens_wins_for_chat(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/chat/completions",
                              json={**CHAT, "max_tokens": 9, "max_completion_tokens": 3})).json()
    assert body["usage"]["completion_tokens"] == 3


async def test_chat_stream_with_usage(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json={
        **CHAT, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = chunks[1:-1]
    assert len(content) == 4
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert [c["choices"][0]["finish_reason"] for c in content] == [None, None, None, "length"]
    text = "".join(c["choices"][0]["delta"]["content"] for c in content)
    non_stream = (await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})).json()
    assert text == non_stream["choices"][0]["message"]["content"]
    usage = chunks[-1]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 4
    assert usage["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0


async def test_completion_stream_without_usage(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/completions", json={"prompt": ["Hello there"], "max_tokens": 3,
                                                          "stream": True})
    events = sse_events(response.text)
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]"
    assert [c["object"] for c in chunks] == ["text_completion"] * 3
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]


async def test_token_id_prompt(client: httpx.AsyncClient) -> None:
    ids = (await client.post("/tokenize", json={"prompt": "Hello there, general Kenobi"})).json()["tokens"]
    body = (await client.post("/v1/completions", json={"prompt": ids, "max_tokens": 2})).json()
    assert body["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_string_ends_the_output_before_it(client: httpx.AsyncClient, stream: bool) -> None:
    full = (await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 8})).json()
    text = full["choices"][0]["text"]
    words = text.split(" ")[1:]  # the filler is " w1 w2 ...": stop at the fourth word
    stop = " " + words[3]
    response = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 8, "stop": [stop],
                                                          "stream": stream})
    if stream:
        chunks = [orjson.loads(e) for e in sse_events(response.text)[:-1]]
        got = "".join(c["choices"][0]["text"] for c in chunks)
        last = chunks[-1]["choices"][0]
    else:
        got = response.json()["choices"][0]["text"]
        last = response.json()["choices"][0]
    assert got == text[: text.index(stop)]
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", stop)
    assert await metric(client, "vllm:request_success_total", finished_reason="stop") == 1


async def test_priority_needs_the_priority_policy() -> None:
    async with SimFleet(scheduling_policy="priority") as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        response = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "priority": -1})
        assert response.status_code == 200


@pytest.mark.parametrize(
    ("path", "payload", "status", "param"),
    [
        ("/v1/chat/completions", {**CHAT, "model": "nope"}, 404, "model"),
        ("/v1/completions", {"model": "nope", "prompt": "x"}, 404, "model"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": -1}, 400, "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": "many"}, 400, "max_tokens"),
        ("/v1/chat/completions", {"model": "tiny-llama", "messages": "hi"}, 400, "messages"),
        ("/v1/completions", {"prompt": 12}, 400, "prompt"),
        ("/v1/completions", {"prompt": ""}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 5000}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "word " * 4000, "max_tokens": 200}, 400, None),
        ("/v1/completions", {"prompt": "x", "priority": 1}, 400, "priority"),
    ],
)
async def test_errors_answer_in_vllms_shape(client: httpx.AsyncClient, path: str, payload: dict[str, object],
                                            status: int, param: str | None) -> None:
    response = await client.post(path, json=payload)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    if param is not None:
        assert error["param"] == param
    if status == 404:
        assert error["message"] == "The model `nope` does not exist. Valid aliases: tiny-llama."
    if path == "/v1/completions" and payload.get("max_tokens") == 200:
        assert "maximum context length" in error["message"] or "max_model_len" in error["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"[]", b""])
async def test_invalid_json_is_400(client: httpx.AsyncClient, raw: bytes) -> None:
    for path in ("/v1/chat/completions", "/v1/completions"):
        response = await client.post(path, content=raw, headers={"content-type": "application/json"})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == 400


async def _raw_request(url: str, path: str,
                       payload: object) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = orjson.dumps(payload)
    writer.write(b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
    await writer.drain()
    return reader, writer


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


@pytest.mark.parametrize("stream", [True, False])
async def test_disconnect_aborts_and_frees_blocks(stream: bool) -> None:
    async with SimFleet(profile="tiny", time_scale=5.0) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        replica = fleet.replica(0)
        reader, writer = await _raw_request(fleet.urls[0], "/v1/completions",
                                            {"prompt": "hello " * 300, "max_tokens": 2000, "stream": stream})
        if stream:
            await reader.readuntil(b"data: ")  # the first token went out
        else:
            async def running() -> bool:
                return replica.stats.num_running == 1 and replica.stats.kv_cache_usage > 0
            await eventually(running)
        await _close(writer)

        async def freed() -> bool:
            return replica.stats.num_running == 0 and replica.stats.kv_cache_usage == 0.0
        await eventually(freed)
        assert await metric(client, "vllm:request_success_total", finished_reason="abort") == 1
        assert await metric(client, "vllm:num_requests_running") == 0
        assert await metric(client, "vllm:kv_cache_usage_perc") == 0.0


async def test_disconnect_while_queued_aborts() -> None:
    async with SimFleet(profile="tiny", max_num_seqs=1, time_scale=5.0) as fleet, \
            httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        replica = fleet.replica(0)
        busy = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "a", "max_tokens": 60}))
        _, writer = await _raw_request(fleet.urls[0], "/v1/completions", {"prompt": "b", "max_tokens": 5})

        async def queued() -> bool:
            return replica.stats.num_waiting == 1
        await eventually(queued)
        await _close(writer)

        async def gone() -> bool:
            return replica.stats.num_waiting == 0
        await eventually(gone)
        assert await metric(client, "vllm:request_success_total", finished_reason="abort") == 1
        assert (await busy).status_code == 200
