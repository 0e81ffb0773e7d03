from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtests.des.prompts import PromptError, PromptTokenizer, body_prompt_ids
from simulator.tokenizer import encode, render_chat

# Characters that stress the tokenizer's piece boundaries: every class, ASCII whitespace of each kind,
# multi-byte text, and the template's own "<|", "|>".
_TEXT = st.lists(st.sampled_from([*"aZ9 .,<|>\n\t\r\x0b\x0c-é漢\u2028", "  ", "<|user|>"]),
                max_size=30).map("".join)
_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "a b"]),
                                  "content": _TEXT})


@settings(max_examples=400, deadline=None)
@given(st.lists(_MESSAGE, min_size=1, max_size=5))
def test_chat_ids_equal_tokenizing_the_whole_rendered_chat(messages: list[dict[str, Any]]) -> None:
    tok = PromptTokenizer()
    expected = encode(render_chat(messages))
    assert tok.chat_ids(messages) == expected
    assert tok.chat_ids(messages) == expected  # again, from the cache


def test_repeated_messages_are_tokenized_once() -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 50 + "End."}
    tok = PromptTokenizer()
    for i in range(10):
        ids = tok.chat_ids([system, {"role": "user", "content": f"Question number {i}?"}])
        assert ids == encode(render_chat([system, {"role": "user", "content": f"Question number {i}?"}]))
    assert tok.misses == 11 and tok.hits == 9
    system_tokens = len(encode(f"<|system|>\n{system['content']}\n"))
    assert system_tokens < tok.tokens_encoded < 2 * system_tokens  # the system prompt once, not 10 times


@pytest.mark.parametrize(
    "content",
    ["ends with a space ", "ends with a newline\n", "", None, [{"type": "text", "text": "a part"}]],
)
def test_contents_that_could_move_a_piece_boundary_are_tokenized_whole(content: Any) -> None:
    messages = [{"role": "user", "content": content}, {"role": "user", "content": "next"}]
    tok = PromptTokenizer()
    assert tok.chat_ids(messages) == encode(render_chat(messages))
    assert tok.misses == 0  # no piece cached: the whole prompt went through the tokenizer


def test_the_cache_is_bounded_in_tokens() -> None:
    tok = PromptTokenizer(max_cached_tokens=50)
    for i in range(20):
        tok.chat_ids([{"role": "user", "content": f"message {i} with a few words in it."}])
    assert tok._cached_tokens <= 50
    tok.chat_ids([{"role": "user", "content": "message 19 with a few words in it."}])
    assert tok.hits == 1  # the most recent piece is still there


def test_completions_prompts() -> None:
    tok = PromptTokenizer()
    assert body_prompt_ids(tok, "completions", {"prompt": "Hello there."}) == encode("Hello there.")
    assert body_prompt_ids(tok, "completions", {"prompt": ["Hello there."]}) == encode("Hello there.")
    assert body_prompt_ids(tok, "completions", {"prompt": [5, 6, 7]}) == [5, 6, 7]
    assert body_prompt_ids(tok, "completions", {"prompt": [[5, 6]]}) == [5, 6]


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("chat", {"messages": []}),
        ("chat", {"messages": [{"content": "no role"}]}),
        ("completions", {"prompt": ""}),
        ("completions", {"prompt": ["a", "b"]}),
        ("completions", {"prompt": [1, -2]}),
    ],
)
def test_prompts_the_replica_refuses(endpoint: str, body: dict[str, Any]) -> None:
    with pytest.raises(PromptError):
        body_prompt_ids(PromptTokenizer(), endpoint, body)
