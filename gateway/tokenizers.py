"""Tokenizers the gateway can use for exact token counts and token-block prefix keys.

`models[].tokenizer` names one per pool:

- `none` (the default): no tokenizer; the gateway estimates ~4 bytes per token and hashes byte blocks.
- `sim`: the replica simulator's own tokenizer and chat template, so counts and blocks match what a
  simulated replica computes exactly.
- a directory: the model's own tokenizer files, as vLLM loads them (gateway/hf_tokenizer.py), so the
  ids are the engine's own — what its KV-cache events carry.

`prompt_ids(tok, endpoint, body)` is the one way to get the ids the engine will see for a request's
(first) prompt; `full_blocks` cuts them as the engine's KV cache does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from policies.prompt_text import batch_prompts


class PromptNotReproducible(Exception):
    """kvgate cannot compute the engine's ids for this prompt (media parts, a malformed tool call, ...):
    the caller falls back to the byte estimate and lets the replica judge the request."""


class PromptRejected(ValueError):
    """The engine would refuse this prompt with a 400 (its chat template raised, options conflict); the
    message is for the client."""


class Tokenizer(Protocol):
    # True when encoding runs without the GIL, so a long prompt is worth encoding in a thread.
    releases_gil: bool

    def encode_chat(self, messages: Sequence[Any], request: Mapping[str, Any] | None = None) -> list[int]:
        """The ids of a chat request's prompt, chat template applied; `request` is the request body
        (its template options: tools, add_generation_prompt, chat_template_kwargs, ...)."""
        ...

    def encode_prompt(self, prompt: Any, request: Mapping[str, Any] | None = None) -> list[int]:
        """The ids of one completions prompt: a string, a list of ids, or a batch (its first prompt)."""
        ...


def prompt_ids(tok: Tokenizer, endpoint: str, body: Mapping[str, Any]) -> list[int]:
    """The ids of the prompt a request's KV-cache blocks hold: the chat prompt, or a completions
    request's first prompt (a batch runs on one replica; its first prompt decides where the prefix is).
    Raises PromptNotReproducible or PromptRejected."""
    if endpoint == "chat":
        return tok.encode_chat(body["messages"], body)
    batch = batch_prompts(body["prompt"])
    return tok.encode_prompt(body["prompt"] if batch is None else batch[0], body)


def full_blocks(ids: Sequence[int], block_size: int) -> list[list[int]]:
    """`ids` cut into the full blocks of `block_size` the engine caches (a partial tail is not cached)."""
    return [list(ids[i : i + block_size]) for i in range(0, len(ids) - block_size + 1, block_size)]


class SimTokenizer:
    """The simulator's tokenizer. Its ids reach 2**35; they are folded to 32 bits for block keys."""

    releases_gil = False

    def __init__(self) -> None:
        from simulator import tokenizer

        self._tok = tokenizer

    def encode_chat(self, messages: Sequence[Any], request: Mapping[str, Any] | None = None) -> list[int]:
        return _fold(self._tok.encode(self._tok.render_chat(messages)))

    def encode_prompt(self, prompt: Any, request: Mapping[str, Any] | None = None) -> list[int]:
        if isinstance(prompt, str):
            return _fold(self._tok.encode(prompt))
        if prompt and isinstance(prompt[0], str):
            return _fold(self._tok.encode(prompt[0]))
        if prompt and isinstance(prompt[0], list):
            return _fold(prompt[0])
        return _fold(prompt)


def _fold(ids: Sequence[int]) -> list[int]:
    return [(i ^ (i >> 32)) & 0xFFFFFFFF for i in ids]


def tokenizer_for(setting: str, reuse: Tokenizer | None = None) -> Tokenizer | None:
    """The tokenizer `models[].tokenizer` names (a directory: an absolute path, as the config resolves
    it). `reuse`, the pool's tokenizer until now, is kept when it was loaded from the same files,
    unchanged since: a reload does not read a large tokenizer.json again. Raises ValueError for a
    directory that does not hold a usable tokenizer (gateway/hf_tokenizer.py says why)."""
    if setting == "none":
        return None
    if setting == "sim":
        return reuse if isinstance(reuse, SimTokenizer) else SimTokenizer()
    from gateway.hf_tokenizer import HfTokenizer, load_tokenizer_dir

    if isinstance(reuse, HfTokenizer) and reuse.unchanged(setting):
        return reuse
    return load_tokenizer_dir(setting)
