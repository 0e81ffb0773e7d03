"""policies/model_names: canonical names and how a name splits into base and adapter."""

from __future__ import annotations

import pytest

from policies.model_names import canonical, split_canonical

BASES = {"llama-3-8b", "llama3:8b", "qwen"}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("llama-3-8b", ("llama-3-8b", None)),
        ("llama-3-8b:chat-v2", ("llama-3-8b", "chat-v2")),
        ("llama3:8b", ("llama3:8b", None)),  # a base whose own name holds the separator
        ("llama3:8b:sql", ("llama3:8b", "sql")),
        ("qwen:a:b", ("qwen", "a:b")),  # no base "qwen:a": the adapter is "a:b"
        ("llama-3-8b:", None),
        ("mistral:x", None),
        ("chat-v2", None),
        ("", None),
    ],
)
def test_split_canonical(name: str, expected: tuple[str, str | None] | None) -> None:
    assert split_canonical(name, BASES) == expected


def test_canonical_round_trips() -> None:
    assert canonical("llama-3-8b", None) == "llama-3-8b"
    assert canonical("llama3:8b", "sql") == "llama3:8b:sql"
    assert split_canonical(canonical("llama3:8b", "sql"), BASES) == ("llama3:8b", "sql")
