"""Over HTTP, a pool with the model's own tokenizer: requests are served; one whose chat template raises is
a 400 in OpenAI's shape that never reaches a replica; what kvgate cannot tokenize (media parts) is
still forwarded; and no malformed message, huge content or template failure crashes the gateway."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.stack import MODEL, chat, stack
from tests.gateway.test_proxy_bad_input import assert_openai_error, replica_requests
from tests.vllm_fixtures import VLLM_FIXTURES

# The fixture's template, refusing tool messages the way real templates refuse what they cannot lay out.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'tool' %}{{ raise_exception('tool messages are not supported') }}{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture
def tokenizer_dir(tmp_path: Path) -> str:
    d = tmp_path / "tok"
    shutil.copytree(VLLM_FIXTURES / "tiny-llama-tokenizer", d)
    (d / "chat_template.jinja").write_text(TEMPLATE)
    return str(d)


def config(tokenizer_dir: str) -> dict[str, Any]:
    return {"models": [{"name": MODEL, "tokenizer": tokenizer_dir}]}


async def test_served_refused_and_forwarded(tokenizer_dir: str) -> None:
    async with stack(replicas=1, config=config(tokenizer_dir)) as s:
        r = await s.client.post("/v1/chat/completions", json=chat("Hello there"))
        assert r.status_code == 200, r.text
        r = await s.client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "t1 w1 " * 2000, "max_tokens": 2}
        )
        assert r.status_code == 200, r.text  # ~8k tokens: encoded in a worker thread

        before = await replica_requests(s)
        body = chat("x")
        body["messages"].append({"role": "tool", "content": "42", "tool_call_id": "c1"})
        r = await s.client.post("/v1/chat/completions", json=body)
        assert_openai_error(r, 400, "tool messages are not supported")
        assert r.json()["error"]["param"] == "messages"
        assert await replica_requests(s) == before

        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
        body = chat("x")
        body["messages"][0]["content"] = [{"type": "text", "text": "What is this?"}, image]
        r = await s.client.post("/v1/chat/completions", json=body)
        # Not tokenized by kvgate: routed on its estimate and forwarded; the replica judges it (the
        # simulator serves text only: its own 400 comes back).
        assert "x-kvgate-replica" in r.headers and r.json()["error"]["type"] == "BadRequestError"


# Mostly messages that pass kvgate's request checks (so they reach the tokenizer and the template),
# with odd parts, odd extra fields and tool calls; some that do not (their 400 comes earlier).
_part = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "refusal", "thinking", "input_text", "image_url", "x"])},
        optional={"text": st.none() | st.text(max_size=4), "refusal": st.none() | st.integers(),
                  "thinking": st.text(max_size=2), "uuid": st.text(max_size=2)},
    ),
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=6)}),
)  # fmt: skip
_tool_calls = st.none() | st.integers() | st.lists(
    st.fixed_dictionaries({}, optional={"function": st.none() | st.fixed_dictionaries(
        {"name": st.text(max_size=2)}, optional={"arguments": st.text(max_size=5) | st.integers()})}),
    max_size=2,
)  # fmt: skip
_good_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "developer", "ziggy"]),
     "content": st.none() | st.text(max_size=6) | st.lists(_part, max_size=3)},
    optional={"name": st.text(max_size=3) | st.integers(), "tool_calls": _tool_calls,
              "reasoning_content": st.text(max_size=2) | st.integers(), "tool_call_id": st.integers()},
)  # fmt: skip
_bad_message = st.fixed_dictionaries(
    {}, optional={"role": st.sampled_from(["", "user"]) | st.integers(),
                  "content": st.integers() | st.dictionaries(st.text(max_size=2), st.integers(), max_size=2)
                  | st.lists(st.text(max_size=2) | st.integers(), min_size=1, max_size=2)},
)  # fmt: skip
_message = st.one_of(_good_message, _good_message, _good_message, _bad_message)
_extra = st.fixed_dictionaries(
    {},
    optional={
        "add_generation_prompt": st.booleans() | st.text(max_size=2),
        "continue_final_message": st.booleans(),
        "chat_template_kwargs": st.none()
        | st.dictionaries(st.sampled_from(["tokenize", "x", "tools"]), st.integers()),
        "tools": st.none()
        | st.lists(st.dictionaries(st.sampled_from(["type", "function"]), st.text(max_size=2))),
        "add_special_tokens": st.booleans() | st.integers(),
    },
)  # fmt: skip


@pytest.mark.timeout(240)
async def test_fuzzed_messages_never_crash_the_gateway(tokenizer_dir: str) -> None:
    async with stack(replicas=1, config=config(tokenizer_dir)) as s:
        seen: list[dict[str, Any]] = []

        @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
        @given(messages=st.lists(_message, min_size=1, max_size=3), extra=_extra)
        def collect(messages: list[dict[str, Any]], extra: dict[str, Any]) -> None:
            seen.append({"model": MODEL, "max_tokens": 2, "messages": messages, **extra})

        collect()
        seen.append(chat("y" * 3_000_000))  # huge content, under the body limit: tokenized off the loop
        for body in seen:
            r = await s.client.post("/v1/chat/completions", json=body)
            assert r.status_code < 500, (body, r.text)
            if r.status_code >= 400:
                assert_openai_error(r, r.status_code)
        assert (await s.client.get("/health")).status_code == 200
