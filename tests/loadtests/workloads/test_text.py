from __future__ import annotations

import random

import pytest

from loadtests.workloads.text import WordText, word_tokens
from tests.loadtests.workloads.tokens import count_tokens


@pytest.mark.parametrize(
    ("word", "space", "tokens"),
    [
        ("a", True, 1),
        ("cache", True, 1),
        ("server", True, 2),
        ("server", False, 1),
        ("gravity", False, 2),
        ("abcdefghijk", True, 2),
        ("abcdefghijkl", True, 3),
    ],
)
def test_word_tokens(word: str, space: bool, tokens: int) -> None:
    assert word_tokens(word, leading_space=space) == tokens


@pytest.mark.parametrize("tokens", [0, 1, 2, 3, 7, 16, 100, 2048])
def test_exact_token_count_for_every_seed(tokens: int) -> None:
    text = WordText()
    for seed in range(10):
        assert count_tokens(text.text(random.Random(seed), tokens)) == tokens
        assert count_tokens(text.text(random.Random(seed), tokens, leading_space=True)) == tokens


def test_about_four_characters_per_token() -> None:
    out = WordText().text(random.Random(0), 20_000)
    assert 3.6 <= len(out) / 20_000 <= 4.6


def test_seeded_and_varied() -> None:
    text = WordText()
    assert text.text(random.Random(5), 300) == text.text(random.Random(5), 300)
    assert text.text(random.Random(5), 300) != text.text(random.Random(6), 300)
    assert len(set(text.text(random.Random(1), 500).lower().replace(".", "").split())) > 100


def test_matches_the_simulator_tokenizer() -> None:
    tokenizer = pytest.importorskip("simulator.tokenizer")
    text = WordText()
    for seed in range(5):
        for n in (1, 5, 64, 1000):
            assert len(tokenizer.encode(text.text(random.Random(seed), n))) == n


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        WordText(())
    with pytest.raises(ValueError):
        WordText(("two words",))
    with pytest.raises(ValueError):
        WordText().text(random.Random(0), -1)
