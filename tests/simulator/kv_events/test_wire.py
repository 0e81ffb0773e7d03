"""The simulator's KV-event encoder writes what vLLM 0.32 wrote, byte for byte, and the gateway reads it."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.kv_events import wire as gateway_wire
from simulator.kv_events.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from simulator.kv_events.wire import REPLAY_END, decode_replay_start, encode_payload, encode_seq
from tests.gateway.kv_events.captured import captured


def _event(raw: dict[str, Any]) -> KVEvent:
    if raw["type"] == "BlockStored":
        extra = raw["extra_keys"]
        return BlockStored(
            block_hashes=tuple(raw["block_hashes"]), parent_block_hash=raw["parent_block_hash"],
            token_ids=tuple(raw["token_ids"]), block_size=raw["block_size"], lora_id=raw["lora_id"],
            lora_name=raw["lora_name"], medium=raw["medium"], group_idx=raw["group_idx"],
            extra_keys=None if extra is None else tuple(None if k is None else tuple(k) for k in extra),
            kv_cache_spec_kind=raw["kv_cache_spec_kind"],
        )
    if raw["type"] == "BlockRemoved":
        return BlockRemoved(tuple(raw["block_hashes"]), raw["medium"], raw["group_idx"])
    return AllBlocksCleared()


@pytest.mark.parametrize("name", ["stored", "evicted"])
def test_the_captured_batches_encode_to_the_captured_bytes(name: str) -> None:
    for msg in captured(name):
        ts, events, rank = msg.decoded
        topic, seq, payload = msg.frames
        assert topic == b"kv" and encode_seq(msg.seq) == seq
        assert encode_payload(ts, [_event(e) for e in events], rank) == payload


def test_what_the_simulator_encodes_the_gateway_decodes() -> None:
    events: list[KVEvent] = [
        BlockStored((2**64 - 1, 5), None, tuple(range(2**50, 2**50 + 8)), 4, lora_id=2, lora_name="sql",
                    extra_keys=(("sql",), ("sql",))),
        BlockRemoved((2**63,)),
        AllBlocksCleared(),
    ]
    batch = gateway_wire.decode_message([b"kv", encode_seq(7), encode_payload(1.5, events)])
    assert (batch.topic, batch.seq, batch.ts, batch.dp_rank) == ("kv", 7, 1.5, 0)
    stored, removed, cleared = batch.events
    assert isinstance(stored, gateway_wire.BlockStored)
    assert stored.block_hashes == (2**64 - 1, 5) and stored.parent_block_hash is None
    assert stored.token_ids == tuple(range(2**50, 2**50 + 8))  # the simulator's ids, as they are
    assert (stored.lora_name, stored.lora_id, stored.extra_keys) == ("sql", 2, (("sql",), ("sql",)))
    assert removed == gateway_wire.BlockRemoved((2**63,), "GPU", 0)
    assert cleared == gateway_wire.AllBlocksCleared()


def test_sequence_frames_and_replay_start() -> None:
    assert encode_seq(REPLAY_END) == b"\xff" * 8
    assert gateway_wire.decode_seq(encode_seq(12345)) == 12345
    assert decode_replay_start(encode_seq(42)) == 42
    assert decode_replay_start(encode_seq(-1)) == 2**64 - 1  # read unsigned, as vLLM does: asks for nothing
