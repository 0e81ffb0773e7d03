"""`Router.prompt_facts`: the prompt's size for the reservation and its prefix keys for routing."""

from __future__ import annotations

import random

import pytest

from gateway.config import parse_config
from gateway.routing import Router
from gateway.tokenizers import SimTokenizer

MODEL = "m"


def router(tokenizer: str = "none") -> Router:
    cfg = parse_config({"models": [{"name": MODEL, "tokenizer": tokenizer}]})
    return Router(cfg, random.Random(1))


@pytest.mark.parametrize("tokenizer", ["none", "sim"])
@pytest.mark.parametrize(
    "batch",
    [
        ["The first prompt of a batch. " * 20, "a second, shorter one", "and a third " * 7],
        [[5, 6, 7] * 40, [1, 2], [9] * 33],
    ],
    ids=["text", "token-ids"],
)
def test_a_batch_counts_every_prompt_and_routes_on_the_first(tokenizer: str, batch: list[object]) -> None:
    r = router(tokenizer)
    facts = r.prompt_facts("completions", {"prompt": batch}, MODEL, None)
    each = [r.prompt_facts("completions", {"prompt": p}, MODEL, None) for p in batch]
    assert facts.prompt_tokens == sum(f.prompt_tokens for f in each)
    assert facts.prefix_keys == each[0].prefix_keys  # where the batch goes: its first prompt decides
    assert facts.exact is (tokenizer == "sim")


def test_exact_counts_with_the_sim_tokenizer() -> None:
    batch = ["one prompt", "another prompt, a little longer"]
    facts = router("sim").prompt_facts("completions", {"prompt": batch}, MODEL, None)
    tok = SimTokenizer()
    assert facts.prompt_tokens == sum(len(tok.encode_prompt(p)) for p in batch)
