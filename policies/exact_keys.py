"""kvgate's own keys for an engine's KV blocks, the same from a KV event and from a request.

vLLM names its cache blocks by hashes kvgate cannot recompute (the engine's hash function and its
per-process seed), so the exact index (`policies.exact_index`) keys each block by kvgate's own chained
hash of the same tokens, at the engine's own block size:

    key_-1 = seed_for(model, lora_name)                       (policies.prefix)
    key_i  = xxh3_64(block_i tokens, seed = mix(key_{i-1}, extra_i))

where `block_i` is `block_size` token ids packed as 4-byte integers and `extra_i` is what else the
engine hashed into block i besides the adapter: the cache salt on block 0, multimodal hashes. With
no extra, `mix` is the identity, so a chain of plain blocks is exactly `policies.prefix`'s
`byte_block_keys` (and runs in C). Key i names the whole prefix up to block i, for that model and
adapter, as the engine's hash does.

Token ids are folded to 32 bits the way `gateway.tokenizers` folds them (`fold_token_id`): the
simulator's ids reach 2**35, a real vocabulary stays below 2**32 (where folding changes nothing).
Both sides fold, so both agree.

The engine puts the LoRA adapter's name (older releases: its integer id) at the head of every block's
extra keys; it is already in the seed, so `plain_extra` takes it off. Pure functions, no state.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import xxhash

from policies.prefix import TOKEN_ID_BYTES, byte_block_keys, seed_for
from policies.prompt_text import pack_token_ids

_hash = xxhash.xxh3_64_intdigest
_MASK32 = 0xFFFFFFFF


def fold_token_id(token_id: int) -> int:
    """A non-negative token id folded to 32 bits (identity below 2**32)."""
    return (token_id ^ (token_id >> 32)) & _MASK32


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids packed as 4-byte integers, folded first when any is 2**32 or more."""
    try:
        return pack_token_ids(token_ids)
    except ValueError:
        return pack_token_ids([fold_token_id(t) for t in token_ids])


def plain_extra(extra: Any, lora_name: str | None, lora_id: int | None) -> tuple[Any, ...] | None:
    """A block's extra keys without the adapter's own entry; None when nothing else is left."""
    if extra is None:
        return None
    items = tuple(extra) if isinstance(extra, tuple | list) else (extra,)
    if items and items[0] is not None and items[0] in (lora_name, lora_id):
        items = items[1:]
    return items or None


def _mix(key: int, extra: tuple[Any, ...]) -> int:
    return _hash(repr(extra).encode("utf-8", "surrogatepass"), key)


def chain_keys(
    packed: bytes, block_size: int, parent: int, extras: Sequence[tuple[Any, ...] | None] | None = None
) -> tuple[int, ...]:
    """Keys of the full blocks of `packed` (4 bytes a token), chained from `parent`.

    `parent` is the key of the block before the first (or `seed_for(model, lora)` for a first
    block); `extras[i]`, when given, is block i's `plain_extra`.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    size = block_size * TOKEN_ID_BYTES
    if not extras or all(e is None for e in extras):
        return byte_block_keys(packed, size, parent)
    keys: list[int] = []
    key = parent
    for i in range(len(packed) // size):
        extra = extras[i] if i < len(extras) else None
        seed = key if extra is None else _mix(key, extra)
        key = _hash(packed[i * size : (i + 1) * size], seed)
        keys.append(key)
    return tuple(keys)


def request_keys(
    token_bytes: bytes, block_size: int, model: str, adapter: str | None, cache_salt: str | None = None
) -> tuple[int, ...]:
    """A request's block keys at an engine's `block_size`: what that engine's events give its blocks.

    `token_bytes` is the prompt as the engine tokenises it, packed (`pack_tokens`); `cache_salt` is
    the request's `cache_salt`, which the engine hashes into block 0 only.
    """
    seed = seed_for(model, adapter)
    if not cache_salt:
        return chain_keys(token_bytes, block_size, seed)
    return chain_keys(token_bytes, block_size, seed, [(cache_salt,)])


def lazy_request_keys(
    token_bytes: bytes, block_size: int, model: str, adapter: str | None, cache_salt: str | None = None
) -> Iterator[int]:
    """`request_keys`, hashed as they are consumed, in chunks that double from 4 blocks: a match that
    stops early (a cold prompt, a short shared prefix) hashes little of a long prompt, and a long
    match still hashes in C."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    size = block_size * TOKEN_ID_BYTES
    total = len(token_bytes) // size
    if total == 0:
        return
    key = seed_for(model, adapter)
    start = 0
    if cache_salt:
        key = chain_keys(token_bytes[:size], block_size, key, [(cache_salt,)])[0]
        yield key
        start = 1
    chunk = 4
    while start < total:
        end = min(total, start + chunk)
        keys = byte_block_keys(token_bytes[start * size : end * size], size, key)
        yield from keys
        key = keys[-1]
        start = end
        chunk *= 2
