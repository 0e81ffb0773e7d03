"""Request validation: what vLLM accepts, and a 400 (never 422) with a named parameter for the rest."""

from __future__ import annotations

import orjson
import pytest

from simulator.server.errors import ApiError
from simulator.server.openai_schema import (
    DEFAULT_MAX_TOKENS,
    ChatMessage,
    parse_chat,
    parse_completion,
    parse_json_object,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def body(obj: object) -> bytes:
    return orjson.dumps(obj)


def test_chat_defaults() -> None:
    params = parse_chat(body(CHAT))
    assert params.kind == "chat"
    assert params.model == "m"
    assert params.messages == (ChatMessage("user", "hi"),)
    assert params.max_tokens == DEFAULT_MAX_TOKENS == 16
    assert (params.stream, params.include_usage, params.stop, params.priority, params.seed) == (
        False, False, (), 0, None)


@pytest.mark.parametrize(
    ("extra", "field", "expected"),
    [
        ({"max_tokens": 7}, "max_tokens", 7),
        ({"max_completion_tokens": 9, "max_tokens": 7}, "max_tokens", 9),
        ({"max_tokens": None}, "max_tokens", 16),
        ({"stream": True, "stream_options": {"include_usage": True}}, "include_usage", True),
        ({"stream": True, "stream_options": {}}, "include_usage", False),
        ({"stop": "x"}, "stop", ("x",)),
        ({"stop": ["a", "", "b"]}, "stop", ("a", "b")),
        ({"stop": ""}, "stop", ()),
        ({"priority": -3}, "priority", -3),
        ({"seed": 5}, "seed", 5),
        ({"n": 1, "temperature": 0.2, "user": "u"}, "max_tokens", 16),
    ],
)
def test_chat_fields(extra: dict[str, object], field: str, expected: object) -> None:
    assert getattr(parse_chat(body({**CHAT, **extra})), field) == expected


def test_chat_content_parts_are_joined() -> None:
    params = parse_chat(body({"messages": [
        {"role": "system", "content": None},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]}))
    assert params.messages == (ChatMessage("system", ""), ChatMessage("user", "a\nb"))
    assert params.model is None


@pytest.mark.parametrize(
    ("prompt", "text", "ids"),
    [
        ("hello", "hello", None),
        (["hello"], "hello", None),
        ([1, 2, 3], None, (1, 2, 3)),
        ([[4, 5]], None, (4, 5)),
        ("", "", None),
    ],
)
def test_completion_prompt_forms(prompt: object, text: str | None, ids: tuple[int, ...] | None) -> None:
    params = parse_completion(body({"prompt": prompt}))
    assert (params.prompt_text, params.prompt_token_ids, params.kind) == (text, ids, "completion")


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({**CHAT, "max_tokens": -1}, "max_tokens"),
        ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "max_tokens": 1.5}, "max_tokens"),
        ({**CHAT, "max_tokens": "16"}, "max_tokens"),
        ({**CHAT, "max_tokens": True}, "max_tokens"),
        ({**CHAT, "max_completion_tokens": -2}, "max_completion_tokens"),
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
        ({**CHAT, "model": 3}, "model"),
        ({**CHAT, "stream": "yes"}, "stream"),
        ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
        ({**CHAT, "stream": True, "stream_options": []}, "stream_options"),
        ({**CHAT, "stop": 5}, "stop"),
        ({**CHAT, "stop": ["a", 1]}, "stop"),
        ({**CHAT, "priority": "high"}, "priority"),
        ({**CHAT, "n": 2}, "n"),
        ({**CHAT, "seed": "s"}, "seed"),
    ],
)
def test_chat_rejects_bad_fields(payload: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_chat(body(payload))
    assert (info.value.status, info.value.param) == (400, param)


@pytest.mark.parametrize("prompt", [None, 3, [], ["a", "b"], [[1], [2]], [-1, 2], [1, "a"], {"x": 1}])
def test_completion_rejects_bad_prompts(prompt: object) -> None:
    with pytest.raises(ApiError) as info:
        parse_completion(body({"prompt": prompt}))
    assert (info.value.status, info.value.param) == (400, "prompt")


@pytest.mark.parametrize("raw", [b"{bad", b"", b"[1, 2]", b'"text"', b"null", b'{"a": 1,}'])
def test_invalid_json_is_400_in_vllm_shape(raw: bytes) -> None:
    with pytest.raises(ApiError) as info:
        parse_json_object(raw)
    error = orjson.loads(info.value.body())["error"]
    assert error["code"] == 400
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"].startswith("body")
