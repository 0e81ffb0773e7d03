"""The three KV-cache events of vLLM's `vllm/distributed/kv_events.py`, as the simulator records them.

Hashes here are already the external form: unsigned 64-bit integers (`external_hash` maps the
simulator's block keys, which are signed Python hashes, onto [0, 2**64) one to one). Token ids are the
engine's own ids, published as they are (the simulator's tokenizer makes ids up to ~2**51; msgpack
carries them as uint64).

`to_wire()` gives the tagged map vLLM 0.32 puts on the wire, keys in its order (msgspec omits fields
left at their default, which is why `kv_cache_spec_sliding_window` never appears for full attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MEDIUM_GPU = "GPU"
FULL_ATTENTION = "full_attention"
_MASK64 = (1 << 64) - 1


def external_hash(key: int) -> int:
    """A simulator block key (a signed 64-bit Python hash) as an unsigned 64-bit block hash."""
    return key & _MASK64


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks of one request newly findable in the prefix cache, as one chain.

    `token_ids` are `block_size` tokens per hash, in order; `parent_block_hash` is the hash of the
    block before the first one (None when the first is the sequence's first block). `extra_keys` has
    one entry per block: what else went into its hash (vLLM: `(lora_name,)` for an adapter, None for
    the base model).
    """

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    lora_name: str | None = None
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None
    medium: str | None = MEDIUM_GPU
    group_idx: int = 0
    kv_cache_spec_kind: str | None = FULL_ATTENTION

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": "BlockStored",
            "block_hashes": list(self.block_hashes),
            "parent_block_hash": self.parent_block_hash,
            "token_ids": list(self.token_ids),
            "block_size": self.block_size,
            "lora_id": self.lora_id,
            "medium": self.medium,
            "lora_name": self.lora_name,
            "extra_keys": None if self.extra_keys is None else [
                None if keys is None else list(keys) for keys in self.extra_keys
            ],
            "group_idx": self.group_idx,
            "kv_cache_spec_kind": self.kv_cache_spec_kind,
        }


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks no longer findable: evicted because their block was taken for new tokens (vLLM sends
    one hash per event)."""

    block_hashes: tuple[int, ...]
    medium: str | None = MEDIUM_GPU
    group_idx: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": "BlockRemoved",
            "block_hashes": list(self.block_hashes),
            "medium": self.medium,
            "group_idx": self.group_idx,
        }


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was forgotten (`POST /reset_prefix_cache`)."""

    def to_wire(self) -> dict[str, Any]:
        return {"type": "AllBlocksCleared"}


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
