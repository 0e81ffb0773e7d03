"""`Router.prompt_facts` with a model's own tokenizer (a directory in `models[].tokenizer`): exact counts
and keys from the engine's ids, a 400 where the engine would refuse the prompt, the byte estimate where
kvgate cannot reproduce it, long prompts encoded off the event loop, and reloads that keep the loaded
tokenizer when its files did not change."""

from __future__ import annotations

import asyncio
import random
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config import parse_config
from gateway.errors import GatewayError
from gateway.hf_tokenizer import load_tokenizer_dir
from gateway.routing import OFF_LOOP_CHARS, Router
from policies.prefix import seed_for, token_block_keys
from tests.vllm_fixtures import VLLM_FIXTURES

FIXTURE = str(VLLM_FIXTURES / "tiny-llama-tokenizer")
BLOCK_TOKENS = 16
SYSTEM = "You are a helpful assistant for the ACME company. Answer briefly and politely. " * 3


def config(tokenizer: str = FIXTURE) -> Any:
    return parse_config({
        "replicas": [{"url": "http://m0:1", "model": "m", "name": "r0"}],
        "models": [{"name": "m", "tokenizer": tokenizer}],
        "scheduling": {"prefix_index": {"block_tokens": BLOCK_TOKENS}},
    })  # fmt: skip


def router(tokenizer: str = FIXTURE) -> Router:
    return Router(config(tokenizer), random.Random(1))


def chat(*contents: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "system" if i == 0 else "user", "content": c} for i, c in enumerate(contents)]
    }


TOK = load_tokenizer_dir(FIXTURE)
ROUTER = Router(config(), random.Random(1))
QUESTION = chat(SYSTEM, "What is covered?")


@pytest.mark.parametrize(
    ("endpoint", "body", "keyed", "counted"),
    [
        ("chat", QUESTION, TOK.encode_chat(QUESTION["messages"]), 0),
        ("completions", {"prompt": SYSTEM}, TOK.encode_prompt(SYSTEM), 0),
        ("completions", {"prompt": [SYSTEM, "and more"]}, TOK.encode_prompt(SYSTEM),
         len(TOK.encode_prompt("and more"))),
        ("completions", {"prompt": [5, 6, 7] * 20}, [5, 6, 7] * 20, 0),
    ],
)  # fmt: skip
def test_counts_and_keys_are_the_engines_ids(
    endpoint: str, body: dict[str, Any], keyed: list[int], counted: int
) -> None:
    facts = router().prompt_facts(endpoint, body, "m", None)
    assert facts.exact and facts.prompt_tokens == len(keyed) + counted
    assert facts.prefix_keys == token_block_keys(keyed, BLOCK_TOKENS, seed_for("m", None))
    assert len(facts.prefix_keys) == len(keyed) // BLOCK_TOKENS > 0


def test_a_prompt_the_engine_would_refuse_is_a_400(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE, tmp_path / "tok")
    (tmp_path / "tok" / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
        "{{ m.content }}{% endfor %}"
    )
    r = router(str(tmp_path / "tok"))
    with pytest.raises(GatewayError) as err:
        r.prompt_facts("chat", {"messages": [{"role": "tool", "content": "x"}]}, "m", None)
    assert err.value.status == 400 and err.value.param == "messages" and "no tools here" in err.value.message
    assert r.prompt_facts("chat", chat("fine"), "m", None).exact


def test_what_kvgate_cannot_reproduce_falls_back_to_the_byte_estimate() -> None:
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    body = chat(SYSTEM, [{"type": "text", "text": "What is in it?"}, image])
    assert router().prompt_facts("chat", body, "m", None) == router("none").prompt_facts(
        "chat", body, "m", None
    )
    big_ids = {"prompt": [2**40, 1, 2]}  # beyond 32 bits: the engine's vocabulary cannot hold it
    assert not router().prompt_facts("completions", big_ids, "m", None).exact


class ThreadRecorder:
    """A tokenizer that notes the thread each call runs on (the fixture's ids otherwise)."""

    releases_gil = True

    def __init__(self) -> None:
        self.threads: list[int] = []

    def encode_chat(self, messages: Sequence[Any], request: Mapping[str, Any] | None = None) -> list[int]:
        self.threads.append(threading.get_ident())
        return TOK.encode_chat(messages, request)

    def encode_prompt(self, prompt: Any, request: Mapping[str, Any] | None = None) -> list[int]:
        self.threads.append(threading.get_ident())
        return TOK.encode_prompt(prompt, request)


async def test_a_long_prompt_is_encoded_in_a_worker_thread_a_short_one_on_the_loop() -> None:
    r = router()
    recorder = ThreadRecorder()
    r._tokenizers["m"] = recorder
    loop_thread = threading.get_ident()
    long_body = chat("x " * OFF_LOOP_CHARS)
    facts = await r.prompt_facts_async("chat", long_body, "m", None)
    assert facts == router().prompt_facts("chat", long_body, "m", None)
    await r.prompt_facts_async("completions", {"prompt": "short"}, "m", None)
    await r.prompt_facts_async("completions", {"prompt": ["y" * (OFF_LOOP_CHARS + 1), "z"]}, "m", None)
    assert recorder.threads[0] != loop_thread and recorder.threads[1] == loop_thread
    assert recorder.threads[2] != loop_thread and recorder.threads[3] == recorder.threads[2]
    # Concurrent long prompts do not wait on one another's loop turn: all finish, each exact.
    results = await asyncio.gather(*(r.prompt_facts_async("chat", long_body, "m", None) for _ in range(4)))
    assert all(f == facts for f in results)


def test_a_reload_keeps_the_loaded_tokenizer_when_its_files_did_not_change() -> None:
    r = router()
    before = r._tokenizers["m"]
    r.prepare(config(), config()).commit()
    assert r._tokenizers["m"] is before
    r.prepare(config(), config("none")).commit()
    assert r._tokenizers["m"] is None


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**33) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
_message = st.dictionaries(
    st.sampled_from(["role", "content", "name", "tool_calls", "tool_call_id", "reasoning", "tools"]),
    _json | st.sampled_from(["user", "assistant", "tool", "developer"]),
    max_size=5,
)
_options = st.dictionaries(
    st.sampled_from(["tools", "documents", "chat_template_kwargs", "add_generation_prompt",
                     "continue_final_message", "reasoning_effort", "add_special_tokens"]),
    _json,
    max_size=3,
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(messages=st.lists(_message | _json, max_size=3), options=_options)
def test_any_json_in_messages_is_counted_or_refused_with_a_400(
    messages: list[Any], options: dict[str, Any]
) -> None:
    # Beyond what the request parser lets through: whatever reaches prompt_facts, it answers with facts
    # (exact or estimated) or a 400, never another exception.
    try:
        facts = ROUTER.prompt_facts("chat", {"messages": messages, **options}, "m", None)
    except GatewayError as err:
        assert err.status == 400
    else:
        assert facts.prompt_tokens >= 0


_ids = st.integers(0, 2**40)
_prompt = (  # the shapes the request parser lets through (gateway/request_parse.py)
    st.text(max_size=20)
    | st.lists(st.text(max_size=8), min_size=1, max_size=3)
    | st.lists(_ids, min_size=1, max_size=8)
    | st.lists(st.lists(st.integers(-2, 2**40), min_size=1, max_size=4), min_size=1, max_size=3)
)


@settings(max_examples=200, deadline=None)
@given(prompt=_prompt, options=_options)
def test_any_parsed_prompt_is_counted_or_refused(prompt: Any, options: dict[str, Any]) -> None:
    try:
        facts = ROUTER.prompt_facts("completions", {"prompt": prompt, **options}, "m", None)
    except GatewayError as err:
        assert err.status == 400
    else:
        assert facts.prompt_tokens >= 0
