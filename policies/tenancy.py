"""Pure per-tenant decisions at admission: the priority band, the model allow-list, token estimates.

Band: a tenant has a default band (config `priority`); the client may ask for a LOWER one (less
important) with the `x-kvgate-priority` header, never a higher one: asking above the default quietly
gets the default, so one client library can be shared by tenants of different standing.

Model allow-list syntax (config `models`), matched against canonical names (policies/model_names):
a base model's name, `base:adapter` for an adapter however the client named it, and a route's name
(the proxy checks a routed request's route and its resolved target):

- `None`: every model is allowed.
- an exact name: `"llama-3-8b"` allows only that model (its adapters are NOT included);
- shell-style wildcards, case-sensitive (`fnmatch.fnmatchcase`): `*` any run of characters, `?` one
  character, `[abc]` / `[!abc]` one character from / not from a set. The usual one is `"base:*"`:
  any adapter of `base` (adapters are named `base:adapter`), but not `base` itself.
- an empty list allows nothing.

Token estimate: without a tokenizer, about 4 bytes of UTF-8 per token (English text with BPE
tokenizers; the same ratio `policies.prefix` uses for byte blocks), rounded up, at least 1; a prompt
given as token ids is counted exactly. A completions batch (`prompt` a list of prompts) is as many
completions as prompts: its prompt tokens are the sum over the prompts, and its output cap is
`max_tokens x n x prompts` (`reserved_output_tokens`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from policies.prefix import BYTES_PER_TOKEN  # one ratio for token estimates and byte blocks
from policies.types import Band

_WILDCARD_CHARS = frozenset("*?[")


def choose_band(default: Band, requested: str | None) -> Band:
    """The band for a request: `requested` (a band name from the header, any case) when it is the
    default or lower, the default when absent, empty or higher. Raises ValueError with a message fit
    for a 400 response when the name is unknown."""
    if requested is None or not requested.strip():
        return default
    band = Band.parse(requested)
    return band if band >= default else default


@dataclass(frozen=True, slots=True)
class ModelAllowList:
    """A compiled allow-list: build once per tenant at config load, ask `allows(model)` per request
    (a set lookup, then one regex match only if the list has wildcards). `everything` = no list."""

    everything: bool
    exact: frozenset[str]
    wildcards: re.Pattern[str] | None

    @classmethod
    def compile(cls, patterns: Sequence[str] | None) -> ModelAllowList:
        if patterns is None:
            return cls(everything=True, exact=frozenset(), wildcards=None)
        if isinstance(patterns, str):
            raise TypeError("patterns must be a sequence of strings, not one string")
        exact = frozenset(p for p in patterns if not _WILDCARD_CHARS.intersection(p))
        globs = [fnmatch.translate(p) for p in patterns if _WILDCARD_CHARS.intersection(p)]
        wildcards = re.compile("|".join(f"(?:{g})" for g in globs)) if globs else None
        return cls(everything=False, exact=exact, wildcards=wildcards)

    def allows(self, model: str) -> bool:
        if self.everything or model in self.exact:
            return True
        return self.wildcards is not None and self.wildcards.match(model) is not None


def model_allowed(patterns: Sequence[str] | None, model: str) -> bool:
    """One-off form of `ModelAllowList.compile(patterns).allows(model)`; the request path should hold
    a compiled list instead."""
    return ModelAllowList.compile(patterns).allows(model)


def estimate_tokens(num_bytes: int) -> int:
    """Tokens in `num_bytes` bytes of prompt text when no tokenizer is configured: ceil(bytes / 4),
    at least 1."""
    return max(1, -(-num_bytes // BYTES_PER_TOKEN))


def output_cap(requested_max_tokens: int | None, default_cap: int) -> int:
    """Output tokens to reserve: the request's `max_tokens` (or `max_completion_tokens`) when given,
    else the tenant's default cap (config `limits.max_output_tokens`)."""
    return default_cap if requested_max_tokens is None else requested_max_tokens


def estimate_prompt_tokens(prompt: str | Sequence[int]) -> int:
    """Tokens in ONE completions prompt when no tokenizer is configured: a string's UTF-8 bytes as
    `estimate_tokens` counts them, token ids exactly (at least 1, like every estimate here)."""
    if isinstance(prompt, str):
        return estimate_tokens(len(prompt.encode("utf-8", "surrogatepass")))
    return max(1, len(prompt))


def reserved_output_tokens(max_tokens: int, n: int, prompts: int) -> int:
    """Output tokens a request may produce, the output half of its reservation: vLLM runs `n` (>= 1)
    choices for each of `prompts` (>= 1; a completions batch, else 1) prompts, each up to
    `max_tokens` (the per-completion cap, already defaulted)."""
    return max_tokens * n * prompts
