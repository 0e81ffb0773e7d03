"""From an OpenAI `messages` list to the conversation vLLM hands its chat template.

vLLM does not give a template the client's messages as they came. It rebuilds each one, and the
template sees only the rebuilt form, so the same rebuilding is what makes kvgate's rendering (and so
its token ids) the engine's (vLLM's `parse_chat_messages`, entrypoints/chat_utils.py):

- content, in one of two shapes chosen per template (`ContentFormat`, detected by
  `gateway.chat_template`): `"string"`, the text parts joined with a newline (a string content is one
  part; no content at all is the empty string), or `"openai"`, a list of `{"type": "text", "text": ...}`
  (a string content too).
- text parts are `text` (also `input_text`, `output_text`), `refusal` and `thinking`; a `text` or
  `refusal` part whose text is missing or null is skipped. `tool_reference` parts carry a tool name.
- an assistant message keeps its `tool_calls` (each call's `arguments`, JSON text in OpenAI's API,
  parsed into an object, `{}` when it is not JSON; an empty list dropped) and its `reasoning`
  (`reasoning_content` is the older name), copied under both names; a tool message keeps its
  `tool_call_id` and has a list of text parts joined into a string; any message keeps a string `name`
  and `task`; a developer message keeps its `tools`.

What kvgate cannot reproduce — media parts (images, audio, video: their placeholders depend on the
model's multimodal processor), unknown part types, malformed tool calls — raises
`PromptNotReproducible`: the caller then routes on its byte estimate and the replica judges the request.
The client's objects are never modified (tool calls are copied before their arguments are parsed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from gateway.tokenizers import PromptNotReproducible

ContentFormat = Literal["string", "openai"]

_TEXT_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
              "thinking": "thinking"}  # fmt: skip
_SKIP_WHEN_NONE = ("text", "refusal")


def conversation(messages: Sequence[Any], fmt: ContentFormat) -> list[dict[str, Any]]:
    """vLLM's conversation for `messages` (already checked by gateway/request_parse.py: objects with a
    non-empty string role). Raises PromptNotReproducible (see the module doc)."""
    out = [_message(m, fmt) for m in messages]
    for m in out:
        if m["role"] == "assistant" and "tool_calls" in m:
            _parse_tool_calls(m)
    return out


def _message(message: Any, fmt: ContentFormat) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise PromptNotReproducible("a message is not an object")
    role = message.get("role")
    if not isinstance(role, str):
        raise PromptNotReproducible("a message has no role")
    content = message.get("content")
    if content is None:
        parts: Sequence[Any] = ()
    elif isinstance(content, str):
        parts = ({"type": "text", "text": content},)
    elif isinstance(content, list):
        parts = content
    else:
        raise PromptNotReproducible(f"content of type {type(content).__name__}")
    items = [p for p in (_part(part, fmt) for part in parts) if p is not None]
    out: dict[str, Any] = {"role": role}
    out["content"] = items if fmt == "openai" else "\n".join(items)
    if role == "assistant":
        if message.get("tool_calls") is not None:
            calls = message["tool_calls"]
            if not isinstance(calls, list):
                raise PromptNotReproducible("tool_calls is not a list")
            out["tool_calls"] = calls
        reasoning = message.get("reasoning")
        if reasoning is None:
            reasoning = message.get("reasoning_content")
        if reasoning is not None:
            out["reasoning"] = out["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        items_now = out["content"]
        if isinstance(items_now, list) and all(
            isinstance(i, dict) and i.get("type") == "text" for i in items_now
        ):
            out["content"] = "\n".join(i.get("text", "") for i in items_now)
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    if role == "developer":
        out["tools"] = message.get("tools")
    return out


def _part(part: Any, fmt: ContentFormat) -> Any:
    """One content part as the template sees it: a string ("string" format) or an object ("openai");
    None for a part vLLM skips."""
    if isinstance(part, str):
        return {"type": "text", "text": part} if fmt == "openai" else part
    if not isinstance(part, Mapping):
        raise PromptNotReproducible("a content part is not an object")
    kind = part.get("type")
    if part.get("uuid") is not None:
        raise PromptNotReproducible("a content part with a uuid (a media item)")
    if kind == "tool_reference":
        name = part.get("name")
        if not isinstance(name, str):
            raise PromptNotReproducible("a tool_reference part without a name")
        return {"type": "tool_reference", "name": name} if fmt == "openai" else name
    key = _TEXT_KEYS.get(kind) if isinstance(kind, str) else None
    if key is None:
        raise PromptNotReproducible(f"content part type {kind!r}")
    text = part.get(key)
    if text is None and kind in _SKIP_WHEN_NONE:
        return None
    if not isinstance(text, str):
        raise PromptNotReproducible(f"a {kind} part whose {key} is not a string")
    return {"type": "text", "text": text} if fmt == "openai" else text


def _parse_tool_calls(message: dict[str, Any]) -> None:
    calls = message["tool_calls"]
    if not calls:
        del message["tool_calls"]  # an empty list keeps templates on their plain-assistant path
        return
    parsed = []
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            raise PromptNotReproducible("a tool call without a function")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:  # empty, blank or not JSON: vLLM passes an empty object
                arguments = {}
        elif not isinstance(arguments, (dict, list)):
            arguments = {}
        parsed.append({**call, "function": {**function, "arguments": arguments}})
    message["tool_calls"] = parsed
