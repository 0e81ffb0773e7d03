"""Decoding vLLM's KV-cache event messages (the ZeroMQ publisher of `--kv-events-config`).

A message is three frames: `[topic, sequence, payload]`.
- topic: the configured topic, UTF-8 (may be empty).
- sequence: 8-byte big-endian signed integer, +1 per batch from 0. The replay socket answers a
  request with the buffered batches and then one frame whose sequence is `REPLAY_END` (-1).
- payload: msgpack of a batch `[ts, events, data_parallel_rank]`. vLLM 0.32 encodes each event as a
  map tagged by `type`; earlier releases encoded events as arrays `[type, field, ...]` in declaration
  order. Both are read here. Block hashes are 64-bit integers (or bytes, for the sha256 hash
  functions; bytes are read as one big-endian integer so a hash is always an int).

Everything a replica sends is untrusted: anything that is not a well-formed message raises
`WireError` (and only that), so a subscriber can count it and carry on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

REPLAY_END = -1
_SEQ_BYTES = 8


class WireError(ValueError):
    """A frame or payload that is not a vLLM KV-event message."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]  # block_size tokens per hash, in order
    block_size: int
    lora_id: int | None = None
    lora_name: str | None = None
    medium: str | None = None
    # Per block: what else the engine hashed into it (multimodal hashes, the cache salt), or None.
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int = 0


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str | None = None
    group_idx: int = 0


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    topic: str
    seq: int
    ts: float
    events: tuple[Event, ...]
    dp_rank: int | None = None


# Field order of the array-like encoding (vLLM's msgspec structs, before tagged maps).
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


def decode_seq(frame: bytes) -> int:
    if len(frame) != _SEQ_BYTES:
        raise WireError(f"sequence frame has {len(frame)} bytes, expected {_SEQ_BYTES}")
    return int.from_bytes(frame, "big", signed=True)


def encode_seq(seq: int) -> bytes:
    return seq.to_bytes(_SEQ_BYTES, "big", signed=True)


def decode_message(frames: Sequence[bytes]) -> EventBatch:
    """One multipart message -> its batch. The replay end marker is not a batch (check the seq)."""
    if len(frames) != 3:
        raise WireError(f"expected 3 frames [topic, seq, payload], got {len(frames)}")
    topic_frame, seq_frame, payload = frames
    try:
        topic = bytes(topic_frame).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError("topic is not UTF-8") from exc
    seq = decode_seq(bytes(seq_frame))
    ts, events, rank = decode_payload(bytes(payload))
    return EventBatch(topic=topic, seq=seq, ts=ts, events=events, dp_rank=rank)


def decode_payload(payload: bytes) -> tuple[float, tuple[Event, ...], int | None]:
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise WireError(f"payload is not msgpack: {exc}") from None
    if not isinstance(raw, list) or len(raw) not in (2, 3):
        raise WireError("batch is not [ts, events, data_parallel_rank]")
    ts, events = raw[0], raw[1]
    rank = raw[2] if len(raw) == 3 else None
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise WireError("batch timestamp is not a number")
    if not isinstance(events, list):
        raise WireError("batch events is not an array")
    if rank is not None and not _is_int(rank):
        raise WireError("data_parallel_rank is not an integer")
    return float(ts), tuple(_event(e) for e in events), rank


def _event(raw: Any) -> Event:
    if isinstance(raw, dict):
        kind = raw.get("type")
        fields = raw
    elif isinstance(raw, list) and raw:
        kind = raw[0]
        names = _STORED_FIELDS if kind == "BlockStored" else _REMOVED_FIELDS
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise WireError("event is neither a tagged map nor a tagged array")
    if kind == "BlockStored":
        return _stored(fields)
    if kind == "BlockRemoved":
        return BlockRemoved(
            block_hashes=_hashes(fields.get("block_hashes")),
            medium=_opt_str(fields.get("medium"), "medium"),
            group_idx=_group(fields.get("group_idx")),
        )
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    raise WireError(f"unknown event type {kind!r}")


def _stored(fields: dict[Any, Any]) -> BlockStored:
    hashes = _hashes(fields.get("block_hashes"))
    tokens = fields.get("token_ids")
    if not isinstance(tokens, list) or not _INT_ONLY.issuperset(map(type, tokens)):
        raise WireError("BlockStored token_ids is not an array of integers")
    size = fields.get("block_size")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise WireError("BlockStored block_size is not a positive integer")
    if len(tokens) != size * len(hashes):
        raise WireError(f"BlockStored has {len(tokens)} tokens for {len(hashes)} blocks of {size}")
    parent = fields.get("parent_block_hash")
    lora_id = fields.get("lora_id")
    if lora_id is not None and not _is_int(lora_id):
        raise WireError("BlockStored lora_id is not an integer")
    extra = fields.get("extra_keys")
    if extra is not None and (not isinstance(extra, list) or len(extra) != len(hashes)):
        raise WireError("BlockStored extra_keys is not one entry per block")
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=None if parent is None else _hash(parent),
        token_ids=tuple(tokens),
        block_size=size,
        lora_id=lora_id,
        lora_name=_opt_str(fields.get("lora_name"), "lora_name"),
        medium=_opt_str(fields.get("medium"), "medium"),
        extra_keys=None if extra is None else tuple(_freeze(x) for x in extra),
        group_idx=_group(fields.get("group_idx")),
    )


def _hashes(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list):
        raise WireError("block_hashes is not an array")
    if _INT_ONLY.issuperset(map(type, raw)):  # the usual case: 64-bit integers
        return tuple(raw)
    return tuple(_hash(h) for h in raw)


def _hash(raw: Any) -> int:
    if _is_int(raw):
        return int(raw)
    if isinstance(raw, bytes) and raw:
        return int.from_bytes(raw, "big")
    raise WireError("a block hash is neither an integer nor bytes")


def _opt_str(raw: Any, name: str) -> str | None:
    if raw is None or isinstance(raw, str):
        return raw
    raise WireError(f"{name} is not a string")


def _group(raw: Any) -> int:
    if raw is None:
        return 0
    if not _is_int(raw):
        raise WireError("group_idx is not an integer")
    return int(raw)


def _freeze(raw: Any) -> Any:
    """Extra keys become hashable (they are part of a block's identity)."""
    if isinstance(raw, list):
        return tuple(_freeze(x) for x in raw)
    if isinstance(raw, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in raw.items()))
    return raw


# Token ids are most of a batch: their types are checked in C (`map(type)` into a set test that stops
# at the first other type), ~8x faster than a Python-level check per id. Exactly int: not bool.
_INT_ONLY = frozenset({int})


def _is_int(raw: Any) -> bool:
    return isinstance(raw, int) and not isinstance(raw, bool)
