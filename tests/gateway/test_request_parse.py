"""Every body a client can send is either a ParsedRequest or a 400 that names the problem."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.request_parse import parse_request, unknown_model

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat(**kw: object) -> bytes:
    return orjson.dumps({**CHAT, **kw})


def test_minimal_chat() -> None:
    p = parse_request(chat(), "chat")
    assert (p.model, p.stream, p.include_usage, p.max_tokens, p.n) == ("m", False, False, None, 1)


def test_streaming_with_usage_and_caps() -> None:
    p = parse_request(
        chat(stream=True, stream_options={"include_usage": True}, max_completion_tokens=7, n=2), "chat"
    )
    assert (p.stream, p.include_usage, p.max_tokens, p.n) == (True, True, 7, 2)


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [("hello", 1), (["a", "b"], 2), (["a"], 1), ([1, 2, 3], 1), ([[1, 2], [3]], 2), (["x"] * 8, 8)],
)
def test_completion_prompt_forms(prompt: object, prompts: int) -> None:
    # A list of strings or of token-id lists is a batch: vLLM runs one completion per prompt.
    p = parse_request(orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 3}), "completions")
    assert (p.max_tokens, p.prompts) == (3, prompts)
    assert parse_request(chat(), "chat").prompts == 1


@pytest.mark.parametrize(
    ("raw", "endpoint", "param", "fragment"),
    [
        (b"{not json", "chat", None, "not valid JSON"),
        (b"\xff\xfe{}", "chat", None, "UTF-8"),
        (b"[1,2]", "chat", None, "JSON object"),
        (b"", "chat", None, "not valid JSON"),
        (orjson.dumps({"messages": CHAT["messages"]}), "chat", "model", "'model' is required"),
        (orjson.dumps({"model": 3, "messages": CHAT["messages"]}), "chat", "model", "non-empty string"),
        (orjson.dumps({"model": "  ", "messages": CHAT["messages"]}), "chat", "model", "non-empty"),
        (orjson.dumps({"model": "m"}), "chat", "messages", "'messages' is required"),
        (orjson.dumps({"model": "m", "messages": []}), "chat", "messages", "non-empty list"),
        (orjson.dumps({"model": "m", "messages": "hi"}), "chat", "messages", "non-empty list"),
        (orjson.dumps({"model": "m", "messages": [1]}), "chat", "messages", "must be an object"),
        (orjson.dumps({"model": "m", "messages": [{"content": "x"}]}), "chat", "messages", "role"),
        (
            orjson.dumps({"model": "m", "messages": [{"role": "user", "content": 5}]}),
            "chat",
            "messages",
            "content",
        ),
        (
            orjson.dumps({"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]}),
            "chat",
            "messages",
            "text must be a string",
        ),
        (chat(max_tokens=-1), "chat", "max_tokens", "between"),
        (chat(max_tokens=0), "chat", "max_tokens", "between"),
        (chat(max_tokens=10**12), "chat", "max_tokens", "between"),
        (chat(max_tokens="10"), "chat", "max_tokens", "integer"),
        (chat(max_tokens=1.5), "chat", "max_tokens", "integer"),
        (chat(max_tokens=True), "chat", "max_tokens", "integer"),
        (chat(max_completion_tokens=-5), "chat", "max_completion_tokens", "between"),
        (chat(n=0), "chat", "n", "between"),
        (chat(stream="yes"), "chat", "stream", "boolean"),
        (chat(stream_options=[]), "chat", "stream_options", "object"),
        (chat(stream_options={"include_usage": 1}), "chat", "stream_options", "boolean"),
        (chat(priority="high"), "chat", "priority", "integer"),
        (orjson.dumps({"model": "m"}), "completions", "prompt", "'prompt' is required"),
        (orjson.dumps({"model": "m", "prompt": 5}), "completions", "prompt", "must be a string"),
        (orjson.dumps({"model": "m", "prompt": []}), "completions", "prompt", "must be a string"),
        (orjson.dumps({"model": "m", "prompt": [1, "a"]}), "completions", "prompt", "must be a string"),
        (orjson.dumps({"model": "m", "prompt": [-1]}), "completions", "prompt", "must be a string"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(
    raw: bytes, endpoint: str, param: str | None, fragment: str
) -> None:
    with pytest.raises(GatewayError) as ei:
        parse_request(raw, endpoint)  # type: ignore[arg-type]
    err = ei.value
    assert err.status == 400
    assert err.param == param
    assert fragment in err.message
    body = orjson.loads(err.body())
    assert body["error"]["code"] == 400 and body["error"]["type"] == "invalid_request_error"


def test_unknown_model_lists_what_exists() -> None:
    err = unknown_model("nope", ["a", "b"])
    assert err.status == 404 and "`nope`" in err.message and "a, b" in err.message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(raw=st.binary(max_size=200))
def test_fuzz_random_bytes_never_crash(raw: bytes) -> None:
    for endpoint in ("chat", "completions"):
        try:
            parse_request(raw, endpoint)  # type: ignore[arg-type]
        except GatewayError as e:
            assert e.status == 400


@settings(max_examples=400, deadline=None)
@given(
    body=st.dictionaries(
        st.sampled_from(
            [
                "model",
                "messages",
                "prompt",
                "max_tokens",
                "max_completion_tokens",
                "n",
                "stream",
                "stream_options",
                "priority",
                "temperature",
            ]
        ),
        json_values,
    )
)
def test_fuzz_structured_bodies_never_crash(body: dict[str, object]) -> None:
    raw = orjson.dumps(body)
    for endpoint in ("chat", "completions"):
        try:
            p = parse_request(raw, endpoint)  # type: ignore[arg-type]
        except GatewayError as e:
            assert e.status == 400
        else:
            assert isinstance(p.model, str) and p.model.strip()
            assert p.max_tokens is None or 1 <= p.max_tokens <= 1_000_000
