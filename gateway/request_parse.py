"""Parse and check an OpenAI-style request body before anything else looks at it.

Everything a client can send ends here as either a `ParsedRequest` or a `GatewayError` with status
400 and a message that names the field. Only the fields kvgate decides on are checked (model, the
prompt, output caps, streaming); sampling parameters pass through for the replica to judge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.errors import GatewayError, bad_request

Endpoint = Literal["chat", "completions"]

MAX_TOKENS_CEILING = 1_000_000  # beyond any context window that exists; larger is a client bug
MAX_N = 128


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A checked request. `body` is the parsed JSON object (kvgate never mutates it in place)."""

    endpoint: Endpoint
    model: str
    stream: bool
    include_usage: bool  # the client itself asked for the usage chunk
    max_tokens: int | None  # as the client gave it (max_completion_tokens for chat), None if absent
    n: int
    body: dict[str, Any]
    has_priority: bool  # the client sent vLLM's `priority` field
    prompts: int = 1  # completions with a list of prompts: vLLM runs one completion per prompt


def _int_field(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"'{name}' must be an integer", name)
    if v < lo or v > hi:
        raise bad_request(f"'{name}' must be between {lo} and {hi}, got {v}", name)
    return v


def _check_content(content: Any, i: int) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise bad_request(f"messages[{i}].content must be a string or a list of parts", "messages")
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad_request(f"messages[{i}].content[{j}] must be an object with a 'type'", "messages")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise bad_request(f"messages[{i}].content[{j}].text must be a string", "messages")


def _check_messages(messages: Any) -> None:
    if messages is None:
        raise bad_request("'messages' is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object", "messages")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise bad_request(f"messages[{i}].role must be a non-empty string", "messages")
        _check_content(m.get("content"), i)


def _check_prompt(prompt: Any) -> int:
    """How many prompts `prompt` holds (a batch is a list of strings or of token-id lists)."""
    if prompt is None:
        raise bad_request("'prompt' is required", "prompt")
    if isinstance(prompt, str):
        return 1
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return len(prompt)
        if all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            return 1
        if all(
            isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
            for p in prompt
        ):
            return len(prompt)
    raise bad_request("'prompt' must be a string, a list of strings, or a list of token ids", "prompt")


def parse_request(raw: bytes, endpoint: Endpoint) -> ParsedRequest:
    """Check `raw` (the request body) for `endpoint`; raises GatewayError(400) on any problem."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        if "utf-8" in str(err).lower():
            raise bad_request("the request body is not valid UTF-8") from None
        raise bad_request(f"the request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")

    model = body.get("model")
    if model is None:
        raise bad_request("'model' is required", "model")
    if not isinstance(model, str) or not model.strip():
        raise bad_request("'model' must be a non-empty string", "model")

    prompts = 1
    if endpoint == "chat":
        _check_messages(body.get("messages"))
        max_tokens = _int_field(body, "max_completion_tokens", 1, MAX_TOKENS_CEILING)
        if max_tokens is None:
            max_tokens = _int_field(body, "max_tokens", 1, MAX_TOKENS_CEILING)
    else:
        prompts = _check_prompt(body.get("prompt"))
        max_tokens = _int_field(body, "max_tokens", 1, MAX_TOKENS_CEILING)

    n = _int_field(body, "n", 1, MAX_N) or 1

    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "stream")
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad_request("'stream_options' must be an object", "stream_options")
        iu = opts.get("include_usage", False)
        if not isinstance(iu, bool):
            raise bad_request("'stream_options.include_usage' must be a boolean", "stream_options")
        include_usage = iu

    priority = body.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise bad_request("'priority' must be an integer", "priority")

    return ParsedRequest(
        endpoint=endpoint,
        model=model,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        n=n,
        body=body,
        has_priority=priority is not None,
        prompts=prompts,
    )


def unknown_model(model: str, known: list[str]) -> GatewayError:
    listed = ", ".join(known) if known else "(none: no replica is serving)"
    return GatewayError(
        404, f"The model `{model}` does not exist. Available models: {listed}.", param="model"
    )
