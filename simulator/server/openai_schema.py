"""Validation of OpenAI-style request bodies, the way vLLM answers bad ones (400, never 422).

Parsing is pure: bytes in, a frozen `GenerationParams` or an `ApiError` out. Tokenizing and checking the
model name belong to the caller, which knows the replica's tokenizer and adapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from simulator.server.errors import ApiError, bad_request

DEFAULT_MAX_TOKENS = 16
"""Output cap when a request names none (vLLM's completions default; chat uses it too here)."""

Kind = Literal["chat", "completion"]


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class GenerationParams:
    """One validated generation request. Exactly one of `messages`, `prompt_text`, `prompt_token_ids` is set.

    `max_tokens` is the output cap in tokens (>= 1); `stop` holds the non-empty stop strings;
    `priority` is vLLM's (lower is served first under the priority policy).
    """

    kind: Kind
    model: str | None
    max_tokens: int
    stream: bool
    include_usage: bool
    stop: tuple[str, ...]
    priority: int
    seed: int | None
    messages: tuple[ChatMessage, ...] | None = None
    prompt_text: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 worded like vLLM's (pydantic's) JSON errors."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        pos = getattr(exc, "pos", 0)
        reason = getattr(exc, "msg", str(exc))
        message = (
            f"1 validation error:\n  {{'type': 'json_invalid', 'loc': 'body.{pos}', "
            f"'msg': 'JSON decode error', 'input': '<dict of 0 items>', 'ctx': {{'error': {reason!r}}}}}"
        )
        raise ApiError(400, message, type="Bad Request", param=f"body.{pos}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "Input should be a valid dictionary or object to extract fields from",
                       type="Bad Request", param="body")
    return value


def parse_chat(body: bytes) -> GenerationParams:
    """A `POST /v1/chat/completions` body. `max_completion_tokens` wins over `max_tokens`."""
    data = parse_json_object(body)
    messages = _messages(data.get("messages"))
    cap = data.get("max_completion_tokens")
    if cap is not None:
        max_tokens = _max_tokens(cap, "max_completion_tokens")
    else:
        max_tokens = _max_tokens(data.get("max_tokens"), "max_tokens")
    return _common(data, "chat", max_tokens, messages=messages)


def parse_completion(body: bytes) -> GenerationParams:
    """A `POST /v1/completions` body: `prompt` is a string, a list of one string, or token ids."""
    data = parse_json_object(body)
    max_tokens = _max_tokens(data.get("max_tokens"), "max_tokens")
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        return _common(data, "completion", max_tokens, prompt_text=prompt)
    if isinstance(prompt, list) and prompt:
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return _common(data, "completion", max_tokens, prompt_text=prompt[0])
        ids = prompt[0] if len(prompt) == 1 and isinstance(prompt[0], list) else prompt
        if ids and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            return _common(data, "completion", max_tokens, prompt_token_ids=tuple(ids))
        if all(isinstance(p, (str, list)) for p in prompt):
            raise bad_request("Batched prompts (more than one) are not supported by the simulator.", "prompt")
    raise bad_request("prompt must be a string, a list of one string, or a list of token ids (ints >= 0).",
                      "prompt")


def parse_messages(value: object) -> tuple[ChatMessage, ...]:
    """Chat `messages` (also used by `/tokenize`)."""
    return _messages(value)


def _common(data: dict[str, Any], kind: Kind, max_tokens: int, **prompt: Any) -> GenerationParams:
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string.", "model")
    stream = data.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("stream must be a boolean.", "stream")
    options = data.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
        if not isinstance(options, dict):
            raise bad_request("stream_options must be an object.", "stream_options")
        flag = options.get("include_usage", False)
        if not isinstance(flag, bool) and flag is not None:
            raise bad_request("stream_options.include_usage must be a boolean.", "stream_options")
        include_usage = bool(flag)
    n = data.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise bad_request("Only n=1 is supported by the simulator.", "n")
    priority = data.get("priority", 0)
    if priority is None:
        priority = 0
    if not _is_int(priority):
        raise bad_request("priority must be an integer.", "priority")
    seed = data.get("seed")
    if seed is not None and not _is_int(seed):
        raise bad_request("seed must be an integer.", "seed")
    return GenerationParams(
        kind=kind, model=model, max_tokens=max_tokens, stream=stream, include_usage=include_usage,
        stop=_stop(data.get("stop")), priority=priority, seed=seed, **prompt,
    )


def _max_tokens(value: object, param: str) -> int:
    if value is None:
        return DEFAULT_MAX_TOKENS
    if not _is_int(value):
        raise bad_request(f"{param} must be an integer, got {value!r}.", param)
    assert isinstance(value, int)
    if value < 1:
        raise bad_request(f"max_tokens must be at least 1, got {value}.", param)
    return value


def _stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(s for s in value if s)
    raise bad_request("stop must be a string or a list of strings.", "stop")


def _messages(value: object) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or not value:
        raise bad_request("messages must be a non-empty list of message objects.", "messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string 'role'.", "messages")
        out.append(ChatMessage(message["role"], _content(message.get("content"), i)))
    return tuple(out)


def _content(content: object, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                raise bad_request(f"messages[{i}].content: only text parts are supported.", "messages")
        return "\n".join(texts)
    raise bad_request(f"messages[{i}].content must be a string or a list of text parts.", "messages")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
