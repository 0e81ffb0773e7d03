"""Bad input over HTTP: each case a clear 4xx in OpenAI's shape, never forwarded, never a 500."""

from __future__ import annotations

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.stack import MODEL, chat, metric_value, stack


def assert_openai_error(r: httpx.Response, status: int, fragment: str = "") -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert err["code"] == status
    assert fragment in err["message"]


async def replica_requests(s) -> float:  # type: ignore[no-untyped-def]
    """Generation requests the replicas saw (all finished reasons), from their own /metrics."""
    total = 0.0
    async with httpx.AsyncClient() as c:
        for url in s.fleet.urls:
            text = (await c.get(url + "/metrics")).text
            from prometheus_client.parser import text_string_to_metric_families

            for fam in text_string_to_metric_families(text):
                for smp in fam.samples:
                    if smp.name == "vllm:request_success_total":
                        total += smp.value
    return total


CASES = [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe\x00garbage", 400, "UTF-8"),
    (b'{"model": "' + MODEL.encode() + b'", "messages": "\xc3\x28"}', 400, "UTF-8"),
    (orjson.dumps([1, 2, 3]), 400, "JSON object"),
    (orjson.dumps({"messages": [{"role": "user", "content": "x"}]}), 400, "'model' is required"),
    (orjson.dumps({"model": MODEL}), 400, "'messages' is required"),
    (orjson.dumps({"model": 42, "messages": [{"role": "user", "content": "x"}]}), 400, "'model'"),
    (orjson.dumps(chat("x", max_tokens=-3)), 400, "max_tokens"),
    (orjson.dumps(chat("x", max_tokens=10**9)), 400, "max_tokens"),
    (orjson.dumps(chat("x", max_tokens="lots")), 400, "max_tokens"),
    (orjson.dumps(chat("x", stream="true")), 400, "stream"),
    (orjson.dumps(chat("x", model="no-such-model")), 404, "`no-such-model` does not exist"),
]


async def test_each_bad_body_is_a_4xx_and_never_reaches_a_replica() -> None:
    async with stack(replicas=1) as s:
        before = await replica_requests(s)
        for raw, status, fragment in CASES:
            r = await s.client.post(
                "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
            )
            assert_openai_error(r, status, fragment)
        r = await s.client.post("/v1/completions", json={"model": MODEL})
        assert_openai_error(r, 400, "'prompt' is required")
        r = await s.client.post("/v1/chat/completions", json=chat("x", model="no-such-model"))
        assert MODEL in r.json()["error"]["message"]  # the 404 lists what exists
        assert await replica_requests(s) == before
        assert await metric_value(s.client, "kvgate_requests_total", {"status": "400"}) >= 10


async def test_body_over_the_limit_is_413() -> None:
    async with stack(replicas=1, config={"server": {"max_body_bytes": 10_000}}) as s:
        r = await s.client.post("/v1/chat/completions", json=chat("y" * 20_000))
        assert_openai_error(r, 413, "over the limit")

        async def chunks():  # type: ignore[no-untyped-def]
            for _ in range(30):  # no Content-Length: the limit holds while streaming the body in
                yield b"z" * 1000

        r = await s.client.post("/v1/chat/completions", content=chunks())
        assert_openai_error(r, 413, "over the limit")


async def test_wrong_method_and_unknown_path_are_openai_shaped() -> None:
    async with stack(replicas=1) as s:
        assert_openai_error(await s.client.get("/v1/chat/completions"), 405, "POST")
        assert_openai_error(await s.client.get("/v2/nothing"), 404)


@pytest.mark.timeout(180)
async def test_fuzzed_bodies_over_http_never_500() -> None:
    async with stack(replicas=1) as s:
        # hypothesis drives a sync function: it collects bodies, the loop below sends them.
        seen: list[tuple[dict[str, object], str]] = []

        @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
        @given(
            body=st.dictionaries(
                st.sampled_from(
                    ["model", "messages", "prompt", "max_tokens", "stream", "n", "stream_options"]
                ),
                st.none()
                | st.booleans()
                | st.integers(-5, 5)
                | st.text(max_size=5)
                | st.sampled_from([MODEL])
                | st.lists(
                    st.dictionaries(st.sampled_from(["role", "content"]), st.text(max_size=4)), max_size=2
                ),
            ),
            endpoint=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
        )
        def collect(body: dict[str, object], endpoint: str) -> None:
            seen.append((body, endpoint))

        collect()
        for body, endpoint in seen:
            r = await s.client.post(endpoint, json=body)
            assert r.status_code < 500, (body, r.text)
            if r.status_code >= 400:
                assert_openai_error(r, r.status_code)
