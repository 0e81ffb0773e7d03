"""A replica's `GET /v1/models` body -> the base models and LoRA adapters it serves.

vLLM lists the base model with `parent: null` and each loaded adapter with `parent` = the base model's
name. The body is small and polled every few seconds, so it is parsed whole with orjson.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import orjson

_NO_ADAPTERS: Mapping[str, str] = MappingProxyType({})


class ModelsParseError(ValueError):
    """The body is not an OpenAI model list; the message says why (short)."""


@dataclass(frozen=True, slots=True)
class ServedModels:
    """What one replica serves. `adapters` maps adapter name -> parent base model (read-only)."""

    base_models: tuple[str, ...] = ()
    adapters: Mapping[str, str] = field(default_factory=lambda: _NO_ADAPTERS)


def parse_models(body: bytes) -> ServedModels:
    """Parse a `/v1/models` body. Raises only `ModelsParseError`.

    Entries keep the replica's order; a repeated id counts once. Unknown fields are ignored. An entry
    that is not an object with a non-empty string `id`, or whose `parent` is neither null nor a
    non-empty string, makes the whole body invalid (a replica that writes that is not a vLLM we know).
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise ModelsParseError(f"not JSON: {err}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ModelsParseError("expected an object with a 'data' list")
    bases: dict[str, None] = {}  # ordered set
    adapters: dict[str, str] = {}
    for i, entry in enumerate(data):
        model_id = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(model_id, str) or not model_id:
            raise ModelsParseError(f"data[{i}]: expected an object with a string 'id'")
        parent = entry.get("parent")
        if parent is None:
            bases[model_id] = None
        elif isinstance(parent, str) and parent:
            adapters.setdefault(model_id, parent)
        else:
            raise ModelsParseError(f"data[{i}].parent: expected null or a model name")
    return ServedModels(
        base_models=tuple(bases),
        adapters=MappingProxyType(adapters) if adapters else _NO_ADAPTERS,
    )
