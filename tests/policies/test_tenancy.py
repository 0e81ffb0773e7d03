from __future__ import annotations

import pytest

from policies.tenancy import (
    ModelAllowList,
    choose_band,
    estimate_prompt_tokens,
    estimate_tokens,
    model_allowed,
    output_cap,
    reserved_output_tokens,
)
from policies.types import Band

C, S, X = Band.CRITICAL, Band.STANDARD, Band.SHEDDABLE


@pytest.mark.parametrize(
    ("default", "requested", "band"),
    [
        (S, None, S),
        (S, "", S),
        (S, "  ", S),
        (S, "sheddable", X),  # lower: granted
        (S, "standard", S),
        (S, "critical", S),  # higher than the tenant's default: quietly the default
        (C, "critical", C),
        (C, "standard", S),
        (C, "SHEDDABLE", X),  # any case
        (X, " critical ", X),
        (X, "sheddable", X),
    ],
)
def test_choose_band(default: Band, requested: str | None, band: Band) -> None:
    assert choose_band(default, requested) is band


@pytest.mark.parametrize("requested", ["urgent", "0", "critical,standard"])
def test_choose_band_refuses_unknown_names_with_a_message(requested: str) -> None:
    with pytest.raises(ValueError, match="expected one of: critical, standard, sheddable"):
        choose_band(S, requested)


ACME = ["llama-3-8b", "llama-3-8b:*"]


@pytest.mark.parametrize(
    ("patterns", "model", "allowed"),
    [
        (None, "anything", True),
        ([], "llama-3-8b", False),
        (ACME, "llama-3-8b", True),
        (ACME, "llama-3-8b:sql-lora", True),  # any adapter of the base
        (ACME, "llama-3-8b-instruct", False),  # a different model sharing a prefix
        (ACME, "llama-3-70b", False),
        (ACME, "LLAMA-3-8B", False),  # case-sensitive, like model names
        (["llama-3-8b:*"], "llama-3-8b", False),  # adapters only, not the base
        (["llama-3-8b"], "llama-3-8b:sql-lora", False),  # the base only, not its adapters
        (["qwen-?b"], "qwen-7b", True),
        (["qwen-?b"], "qwen-14b", False),
        (["m[12]"], "m2", True),
        (["m[!12]"], "m2", False),
        (["a.b"], "axb", False),  # "." is literal, not a regex
        (["*"], "whatever:adapter", True),
        (["x", "llama-3-8b:*", "y*z"], "yyz", True),
    ],
)
def test_model_allow_list(patterns: list[str] | None, model: str, allowed: bool) -> None:
    assert model_allowed(patterns, model) is allowed
    assert ModelAllowList.compile(patterns).allows(model) is allowed


def test_allow_list_refuses_a_bare_string() -> None:
    with pytest.raises(TypeError):
        ModelAllowList.compile("llama-3-8b")


@pytest.mark.parametrize(
    ("num_bytes", "tokens"),
    [(0, 1), (1, 1), (4, 1), (5, 2), (8, 2), (4000, 1000), (4001, 1001)],
)
def test_estimate_tokens(num_bytes: int, tokens: int) -> None:
    assert estimate_tokens(num_bytes) == tokens


@pytest.mark.parametrize(("requested", "default", "cap"), [(None, 4096, 4096), (16, 4096, 16), (0, 4096, 0)])
def test_output_cap(requested: int | None, default: int, cap: int) -> None:
    assert output_cap(requested, default) == cap


@pytest.mark.parametrize(
    ("max_tokens", "n", "prompts", "reserved"),
    [(100, 1, 1, 100), (100, 3, 1, 300), (100, 1, 8, 800), (100, 2, 8, 1600), (1, 128, 50, 6400)],
)
def test_reserved_output_tokens_count_every_completion(
    max_tokens: int, n: int, prompts: int, reserved: int
) -> None:
    # vLLM runs n choices for each prompt of a completions batch, each up to max_tokens.
    assert reserved_output_tokens(max_tokens, n, prompts) == reserved


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [("", 1), ("abcd", 1), ("abcde", 2), ("é" * 4, 2), ([7], 1), ([1, 2, 3, 4, 5], 5), ([], 1)],
)
def test_estimate_prompt_tokens_of_one_prompt(prompt: str | list[int], tokens: int) -> None:
    # Text: UTF-8 bytes / 4 like estimate_tokens; token ids are tokens, counted exactly.
    assert estimate_prompt_tokens(prompt) == tokens
