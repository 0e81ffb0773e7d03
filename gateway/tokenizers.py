"""Tokenizers the gateway can use for exact token counts and token-block prefix keys.

`none` (the default) means no tokenizer: the gateway estimates ~4 bytes per token and hashes byte
blocks. `sim` is the replica simulator's own tokenizer and chat template, so counts and blocks match
what a simulated replica computes exactly. (A Hugging Face tokenizer would slot in here the same way.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class Tokenizer(Protocol):
    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]: ...

    def encode_prompt(self, prompt: Any) -> list[int]: ...


class SimTokenizer:
    """The simulator's tokenizer. Its ids reach 2**35; they are folded to 32 bits for block keys."""

    def __init__(self) -> None:
        from simulator import tokenizer

        self._tok = tokenizer

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        return _fold(self._tok.encode(self._tok.render_chat(messages)))

    def encode_prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            return _fold(self._tok.encode(prompt))
        if prompt and isinstance(prompt[0], str):
            return _fold(self._tok.encode(prompt[0]))
        if prompt and isinstance(prompt[0], list):
            return _fold(prompt[0])
        return _fold(prompt)


def _fold(ids: Sequence[int]) -> list[int]:
    return [(i ^ (i >> 32)) & 0xFFFFFFFF for i in ids]


def tokenizer_for(name: str) -> Tokenizer | None:
    if name == "none":
        return None
    if name == "sim":
        return SimTokenizer()
    raise ValueError(f"unknown tokenizer {name!r}")
