"""The models one replica serves: its base model and the LoRA adapters loaded on it, as vLLM lists them."""

from __future__ import annotations

import os
import time

import orjson

from simulator.server.errors import ApiError


class ModelRegistry:
    """Base model name + loaded adapters (name -> path), in load order. Owned by one replica's loop.

    `lora_enabled` is False when the replica runs without LoRA (`max_loras` = 0): then loading fails.
    Each load gets the next integer id from 1 (vLLM's `lora_int_id`; an adapter loaded again gets a new
    one), which KV-cache events publish as `lora_id`.
    """

    def __init__(self, base_model: str, max_model_len: int, *, lora_enabled: bool,
                 adapters: dict[str, str] | None = None) -> None:
        self.base_model = base_model
        self.max_model_len = max_model_len
        self.lora_enabled = lora_enabled
        self._adapters: dict[str, str] = dict(adapters or {})
        self._ids = {name: i for i, name in enumerate(self._adapters, start=1)}
        self._next_id = len(self._ids) + 1

    @property
    def adapters(self) -> tuple[str, ...]:
        return tuple(self._adapters)

    def lora_int_id(self, adapter: str | None) -> int | None:
        """The integer id of a loaded adapter (None for the base model or an unknown name)."""
        return None if adapter is None else self._ids.get(adapter)

    def resolve(self, model: str | None) -> str | None:
        """The adapter a request's `model` field names (None for the base model); 404 if unknown."""
        if model is None or model == self.base_model:
            return None
        if model in self._adapters:
            return model
        raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {self.base_model}.",
                       param="model")

    def load(self, name: object, path: object) -> str:
        """Load an adapter (vLLM's checks and wording); the plain-text success message."""
        if not self.lora_enabled:
            raise ApiError(400, "LoRA is not enabled on this replica (start it with max_loras >= 1).",
                           param="lora_name")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.", type="InvalidUserInput")
        if name in self._adapters or name == self.base_model:
            raise ApiError(400, f"The lora adapter '{name}' has already been loaded.",
                           type="InvalidUserInput")
        self._adapters[name] = path
        self._ids[name] = self._next_id
        self._next_id += 1
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, name: object) -> str:
        """Unload an adapter; 404 when it is not loaded, like vLLM."""
        if not isinstance(name, str) or not name:
            raise ApiError(400, "either 'lora_name' and 'lora_int_id' needs to be provided.",
                           type="InvalidUserInput")
        if name not in self._adapters:
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.", type="NotFoundError")
        del self._adapters[name]
        del self._ids[name]
        return f"Success: LoRA adapter '{name}' removed successfully."

    def models_body(self) -> bytes:
        """`GET /v1/models`: the base model, then each adapter with `parent` = the base model."""
        created = int(time.time())
        cards = [_card(self.base_model, created, f"/models/{self.base_model}", None, self.max_model_len)]
        cards += [_card(name, created, path, self.base_model, None) for name, path in self._adapters.items()]
        return orjson.dumps({"object": "list", "data": cards})


def _card(model_id: str, created: int, root: str, parent: str | None,
          max_model_len: int | None) -> dict[str, object]:
    return {
        "id": model_id, "object": "model", "created": created, "owned_by": "vllm", "root": root,
        "parent": parent, "max_model_len": max_model_len,
        "permission": [{
            "id": f"modelperm-{os.urandom(8).hex()}", "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
            "organization": "*", "group": None, "is_blocking": False,
        }],
    }
