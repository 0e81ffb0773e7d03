"""Deterministic English-like text of a given length in tokens.

Token counting follows GPT-style pre-tokenizers (and the simulator's tokenizer): a word with its
leading space is cut into pieces of at most 6 bytes, each piece one token (so " cache" is one token,
" server" two, and "server" without a space one); a period is one token. `WordText.text(rng, n)`
returns text that counts exactly `n` tokens under that rule, at about 4 characters per token (the
gateway's byte estimate) for the built-in vocabulary. Real tokenizers differ by a few percent; the
workloads' token figures are these counts.

`WordText` is immutable after construction and safe to share; all randomness comes from the
`random.Random` passed to each call, so equal seeds give equal text.
"""

from __future__ import annotations

import random

VOCABULARY: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on",
    "not", "this", "are", "or", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
    "their", "one", "all", "we", "can", "has", "there", "been", "if", "more", "when", "will", "would",
    "who", "so", "no", "other", "its", "may", "these", "about", "time", "only", "new", "some", "could",
    "first", "then", "do", "any", "like", "my", "now", "over", "such", "our", "man", "me", "even", "most",
    "made", "after", "also", "did", "many", "off", "before", "must", "well", "back", "through", "years",
    "much", "where", "your", "way", "down", "should", "because", "each", "just", "those", "people",
    "how", "too", "little", "state", "good", "very", "make", "world", "still", "own", "see", "men",
    "work", "long", "get", "here", "between", "both", "life", "being", "under", "never", "day", "same",
    "another", "know", "while", "last", "might", "us", "great", "old", "year", "off", "come", "since",
    "against", "go", "came", "right", "used", "take", "three", "house", "system", "river", "market",
    "engine", "cache", "block", "token", "server", "policy", "route", "queue", "memory", "window",
    "signal", "garden", "letter", "number", "reason", "answer", "water", "light", "paper", "table",
    "stone", "field", "music", "storm", "bridge", "forest", "winter", "summer", "island", "silver",
    "copper", "planet", "valley", "harbor", "ticket", "record", "report", "method", "result", "sample",
    "budget", "client", "driver", "energy", "fabric", "gravity", "history", "journey", "kitchen",
    "library", "machine", "network", "orchard", "pattern", "quarter", "railway", "science", "theory",
    "uniform", "variety", "weather", "account", "balance", "capital", "company", "concern", "contract",
    "culture", "develop", "example", "feature", "general", "however", "install", "measure", "natural",
    "observe", "partner", "prepare", "product", "quality", "request", "respond", "service", "station",
    "support", "through", "traffic", "village", "without", "blue", "red", "green", "fast", "slow",
    "warm", "cold", "dark", "open", "near", "far", "high", "low", "deep", "wide", "calm", "bold", "keen",
    "sure", "true", "wise", "fair", "rich", "poor", "safe", "late", "early", "quiet", "sharp", "clear",
)  # fmt: skip

TOKEN_BYTES = 6  # longest pre-token piece, as in the simulator's tokenizer


def word_tokens(word: str, *, leading_space: bool = True) -> int:
    """Tokens for one ASCII word: ceil(bytes / 6), its leading space (if any) counted."""
    return -(-(len(word) + leading_space) // TOKEN_BYTES)


class WordText:
    """Sentences of vocabulary words (capitalized first word, 6-18 words, a period), sized in tokens."""

    __slots__ = ("_cost", "_one_token", "_words")

    def __init__(self, vocabulary: tuple[str, ...] = VOCABULARY) -> None:
        if not vocabulary:
            raise ValueError("WordText needs a vocabulary")
        if any(not w.isascii() or not w.isalpha() for w in vocabulary):
            raise ValueError("vocabulary words must be ASCII letters only")
        self._words = vocabulary
        self._cost = tuple(word_tokens(w) for w in vocabulary)
        self._one_token = tuple(w for w, c in zip(vocabulary, self._cost, strict=True) if c == 1)
        if not self._one_token:
            raise ValueError("the vocabulary needs at least one word of at most 5 letters")

    def text(self, rng: random.Random, tokens: int, *, leading_space: bool = False) -> str:
        """Text of exactly `tokens` tokens (0 gives ""); with `leading_space` it starts with a space
        (for appending to other text without merging words)."""
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        parts: list[str] = []
        remaining = tokens
        sentence_left = 0
        words, costs, short = self._words, self._cost, self._one_token
        n = len(words)
        while remaining > 0:
            if sentence_left == 0:
                sentence_left = rng.randint(6, 18)
                capitalize = True
            if sentence_left == 1 and remaining >= 2 and parts:
                parts.append(".")
                remaining -= 1
                sentence_left = 0
                continue
            i = int(rng.random() * n)
            word, cost = words[i], costs[i]
            first = not parts and not leading_space
            if first:
                cost = word_tokens(word, leading_space=False)
            if cost > remaining:
                word, cost = short[int(rng.random() * len(short))], 1
            if capitalize:
                word = word.capitalize()
                capitalize = False
            parts.append(word if first else " " + word)
            remaining -= cost
            sentence_left -= 1
        return "".join(parts)
