"""One canonical name per servable model: a base model is its own name, an adapter is `base:adapter`.

The canonical name is what config, metrics, headers and tenant allow-lists use. A replica knows an
adapter only by the name it serves it under (vLLM's `lora_name`: the part after the separator), and
a client may send either form. A base model's name may itself hold the separator (`llama3:8b`), so
splitting asks which prefix is a known base: the longest one first (`llama3:8b:chat` is the adapter
`chat` of `llama3:8b` when that base exists).
"""

from __future__ import annotations

from collections.abc import Container

SEPARATOR = ":"


def canonical(base: str, adapter: str | None) -> str:
    """`base` for the base model itself, `base:adapter` for one of its adapters."""
    return base if adapter is None else f"{base}{SEPARATOR}{adapter}"


def split_canonical(name: str, bases: Container[str]) -> tuple[str, str | None] | None:
    """`(base, None)` when `name` is a known base; `(base, adapter)` when it is `base:adapter` with a
    known base and a non-empty adapter; None otherwise. `bases` is asked at most three times."""
    if name in bases:
        return name, None
    head, sep, tail = name.rpartition(SEPARATOR)
    if sep and tail and head in bases:
        return head, tail
    head, sep, tail = name.partition(SEPARATOR)
    if sep and tail and head in bases:
        return head, tail
    return None
