"""A request body's prompt as the simulated replica tokenizes it, tokenizing each distinct message once.

The replica simulator tokenizes a chat as `encode(render_chat(messages))`: every message becomes
`<|role|>\\n{content}\\n`, then `<|assistant|>\\n` follows. Its tokenizer costs about 2 µs per token on
this machine, so a 6k-token system prompt costs ~13 ms; shared-prefix and multi-turn workloads repeat
the same messages thousands of times, and tokenizing every prompt whole would dominate a large run.

Why per-message pieces are exact. The tokenizer's pieces (see `simulator.tokenizer`) are runs of one
character class: word bytes, punctuation (optionally after one ASCII space), or whitespace (with a
lookahead only). Each rendered message ends with `"\\n"`, and the next piece starts with `"<"`: no
piece can hold both (whitespace runs hold no punctuation, punctuation runs hold no `"\\n"`), and when
the character before that `"\\n"` is not whitespace the `"\\n"` is a piece of its own in the whole text
and in the message alone. So `encode(whole) == sum of encode(message pieces)` whenever every
content is a non-empty string that does not end in ASCII whitespace. Otherwise (trailing whitespace,
empty content, a list of parts) the whole prompt is tokenized at once; that is always exact.

Completions prompts (one string) are memoized whole; token-id prompts pass through.

Memory: cached pieces are kept in an LRU bounded by `max_cached_tokens` token ids in total (about 40
bytes each: the list slot and the int). Not thread-safe: one run owns one `PromptTokenizer`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from simulator.server.openai_schema import DEFAULT_MAX_TOKENS
from simulator.tokenizer import encode, render_chat

_ASCII_WS = frozenset(" \t\n\r\x0b\x0c")  # what `\s` matches in the tokenizer's bytes regex
_ASSISTANT = "<|assistant|>\n"


class PromptError(ValueError):
    """A body whose prompt the simulated replica would refuse (the message says why)."""


class PromptTokenizer:
    """Token ids of request bodies, with an LRU of tokenized pieces (see the module docstring).

    `hits`/`misses` count piece lookups, `tokens_encoded` the tokens actually run through the
    tokenizer (for the run's report of what the cache saved).
    """

    __slots__ = ("_cache", "_cached_tokens", "_max_tokens", "_suffix", "hits", "misses", "tokens_encoded")

    def __init__(self, max_cached_tokens: int = 4_000_000) -> None:
        if max_cached_tokens < 0:
            raise ValueError(f"max_cached_tokens must be >= 0, got {max_cached_tokens}")
        self._max_tokens = max_cached_tokens
        self._cache: OrderedDict[Hashable, list[int]] = OrderedDict()
        self._cached_tokens = 0
        self._suffix = encode(_ASSISTANT)
        self.hits = 0
        self.misses = 0
        self.tokens_encoded = 0

    def chat_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """`encode(render_chat(messages))`, from cached per-message pieces when that is exact.

        Raises PromptError where `render_chat` raises (a message without a string role, content of
        another shape).
        """
        pieces: list[list[int]] = []
        for message in messages:
            role = message.get("role") if isinstance(message, Mapping) else None
            content = message.get("content") if isinstance(message, Mapping) else None
            if not (isinstance(role, str) and isinstance(content, str) and content
                    and content[-1] not in _ASCII_WS):
                return self._whole_chat(messages)
            pieces.append(self._piece((role, content), role, content))
        ids: list[int] = []
        for piece in pieces:
            ids += piece
        ids += self._suffix
        return ids

    def text_ids(self, text: str) -> list[int]:
        """`encode(text)` for a completions prompt, memoized whole (a fresh list each call)."""
        return list(self._cached(("text", text), text))

    def _piece(self, key: Hashable, role: str, content: str) -> list[int]:
        return self._cached(key, f"<|{role}|>\n{content}\n")

    def _cached(self, key: Hashable, text: str) -> list[int]:
        cache = self._cache
        ids = cache.get(key)
        if ids is not None:
            cache.move_to_end(key)
            self.hits += 1
            return ids
        self.misses += 1
        ids = encode(text)
        self.tokens_encoded += len(ids)
        if len(ids) <= self._max_tokens:
            cache[key] = ids
            self._cached_tokens += len(ids)
            while self._cached_tokens > self._max_tokens:
                self._cached_tokens -= len(cache.popitem(last=False)[1])
        return ids

    def _whole_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        try:
            text = render_chat(messages)
        except ValueError as err:
            raise PromptError(str(err)) from None
        ids = encode(text)
        self.tokens_encoded += len(ids)
        return ids


def body_prompt_ids(tokenizer: PromptTokenizer, endpoint: str, body: Mapping[str, Any]) -> list[int]:
    """The token ids the simulated replica computes for an OpenAI body of `endpoint` ("chat" or
    "completions"), as `simulator.server.generation` does. Raises PromptError for a prompt the replica
    refuses (no messages, a batch of prompts, an empty prompt)."""
    if endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise PromptError("messages must be a non-empty list of message objects.")
        ids = tokenizer.chat_ids(messages)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = tokenizer.text_ids(prompt)
        elif isinstance(prompt, list) and all(type(t) is int and t >= 0 for t in prompt):
            ids = list(prompt)
        else:
            raise PromptError("prompt must be a string, a list of one string, or a list of token ids.")
    if not ids:
        raise PromptError("The decoder prompt cannot be empty")
    return ids


def engine_max_tokens(endpoint: str, body: Mapping[str, Any]) -> int:
    """The output cap the simulated replica applies to an OpenAI body of `endpoint`
    (`simulator.server.openai_schema`)."""
    cap = body.get("max_completion_tokens") if endpoint == "chat" else None
    if cap is None:
        cap = body.get("max_tokens")
    return cap if type(cap) is int else DEFAULT_MAX_TOKENS
