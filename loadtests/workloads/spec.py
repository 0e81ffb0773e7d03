"""What a workload hands the runner: one `RequestSpec` per request, and the `Workload` contract.

A workload is a seeded, reproducible description of traffic. `requests()` returns a fresh iterator
each call and yields the same specs, in the same order, for the same constructor arguments (the seed
included); it is lazy, so a workload of 10^6 requests costs memory only as it is consumed.

Sequencing contract (the runner honours it): specs that share a `session_id` are sent in the order the
iterator yields them, each only after the previous one of that session has finished. Specs without a
session are independent.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Endpoint = Literal["chat", "completions"]

ENDPOINT_PATHS: Mapping[Endpoint, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send.

    `body` is the OpenAI request body, ready to JSON-encode (model, messages or prompt, max_tokens,
    stream, stream_options...); the runner does not read or change it. `tenant` labels the request in
    per-tenant measures; `api_key`, when set, is sent as `Authorization: Bearer <api_key>`. `group` labels
    requests that share something (a prefix group, an adapter) for breakdowns. `headers` are extra HTTP
    headers. The dict fields are not copied: do not mutate a spec once built.
    """

    request_id: str
    endpoint: Endpoint
    body: dict[str, Any]
    tenant: str | None = None
    api_key: str | None = None
    session_id: str | None = None
    group: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


class Workload(Protocol):
    """A seeded traffic generator. `name` is its kebab-case type name (e.g. `shared-prefix`)."""

    name: str

    def requests(self) -> Iterator[RequestSpec]:
        """A fresh iterator over the workload's specs; identical for identical arguments."""
        ...

    def size(self) -> int:
        """How many specs `requests()` yields."""
        ...

    def describe(self) -> dict[str, Any]:
        """The workload's parameters and derived figures for the report (JSON-serializable)."""
        ...


def chat_body(
    model: str, system: str | None, user: str, max_tokens: int, *, ignore_eos: bool = True
) -> dict[str, Any]:
    """A streaming chat body with usage reporting: [system?, user]."""
    messages: list[dict[str, str]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": user})
    return chat_body_from_messages(model, messages, max_tokens, ignore_eos=ignore_eos)


def chat_body_from_messages(
    model: str, messages: list[dict[str, str]], max_tokens: int, *, ignore_eos: bool = True
) -> dict[str, Any]:
    """A streaming chat body over given messages. `ignore_eos` (a vLLM extension) makes the replica
    write exactly `max_tokens` tokens, so output length is the workload's, not the model's."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def completion_body(
    model: str, system: str | None, user: str, max_tokens: int, *, ignore_eos: bool = True
) -> dict[str, Any]:
    """A streaming completions body; the prompt is `system + "\\n\\n" + user` (system first, as in chat,
    so a shared system prompt is a shared prompt prefix)."""
    prompt = user if system is None else f"{system}\n\n{user}"
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def request_body(
    endpoint: Endpoint, model: str, system: str | None, user: str, max_tokens: int, *, ignore_eos: bool = True
) -> dict[str, Any]:
    """`chat_body` or `completion_body` by endpoint."""
    if endpoint == "chat":
        return chat_body(model, system, user, max_tokens, ignore_eos=ignore_eos)
    return completion_body(model, system, user, max_tokens, ignore_eos=ignore_eos)


def check_positive(**values: float) -> None:
    """ValueError naming the first argument that is not > 0 (constructor argument checks)."""
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
