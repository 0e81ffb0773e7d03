"""The KV-event decoder reads what a real vLLM 0.32 server published, and refuses anything else."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.kv_events.wire import (
    REPLAY_END,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    WireError,
    decode_message,
    decode_payload,
    encode_seq,
)
from tests.gateway.kv_events.captured import captured


@pytest.mark.parametrize("name", ["stored", "evicted"])
def test_every_captured_message_decodes_to_what_the_capture_says(name: str) -> None:
    for msg in captured(name):
        batch = decode_message(msg.frames)
        ts, events, rank = msg.decoded
        assert batch.topic == "kv"
        assert batch.seq == msg.seq
        assert batch.ts == pytest.approx(ts)
        assert batch.dp_rank == rank
        assert len(batch.events) == len(events)
        for got, want in zip(batch.events, events, strict=True):
            assert type(got).__name__ == want["type"]
            if isinstance(got, BlockStored):
                assert list(got.block_hashes) == want["block_hashes"]
                assert got.parent_block_hash == want["parent_block_hash"]
                assert list(got.token_ids) == want["token_ids"]
                assert got.block_size == want["block_size"] == 32
                assert got.lora_name == want["lora_name"]
                assert got.extra_keys is not None and len(got.extra_keys) == len(got.block_hashes)
            elif isinstance(got, BlockRemoved):
                assert list(got.block_hashes) == want["block_hashes"]


def test_the_capture_has_sequences_from_zero_and_every_event_kind_but_clear() -> None:
    seqs = [decode_message(m.frames).seq for m in captured("stored") + captured("evicted")]
    assert seqs == list(range(len(seqs)))
    kinds = {type(e) for m in captured("evicted") for e in decode_message(m.frames).events}
    assert kinds == {BlockStored, BlockRemoved}


def test_stored_chains_link_through_parent_hashes() -> None:
    first = decode_message(captured("stored")[0].frames).events[0]
    second = decode_message(captured("stored")[1].frames).events[0]
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    assert first.parent_block_hash is None and len(first.block_hashes) == 26
    assert second.parent_block_hash in first.block_hashes


def test_array_encoded_events_of_older_vllm_releases_decode_too() -> None:
    payload = msgpack.packb(
        [
            1.5,
            [
                ["BlockStored", [7, 8], None, list(range(8)), 4, None, "GPU"],
                ["BlockRemoved", [7], "GPU"],
                ["AllBlocksCleared"],
            ],
        ]
    )
    ts, events, rank = decode_payload(payload)
    assert ts == 1.5 and rank is None
    assert events[0] == BlockStored(
        block_hashes=(7, 8),
        parent_block_hash=None,
        token_ids=tuple(range(8)),
        block_size=4,
        medium="GPU",
    )
    assert events[1] == BlockRemoved(block_hashes=(7,), medium="GPU")
    assert events[2] == AllBlocksCleared()


def test_bytes_hashes_are_read_as_integers() -> None:
    event = {"type": "BlockRemoved", "block_hashes": [b"\x01\x02"], "medium": None}
    _, events, _ = decode_payload(msgpack.packb([0.0, [event], 0]))
    assert events == (BlockRemoved(block_hashes=(0x0102,)),)


def test_the_replay_end_marker_is_sequence_minus_one() -> None:
    assert REPLAY_END == -1
    assert decode_message([b"kv", encode_seq(-1), msgpack.packb([0.0, [], 0])]).seq == -1


@pytest.mark.parametrize(
    "frames",
    [
        [b"kv", encode_seq(0)],
        [b"kv", b"\x00" * 7, msgpack.packb([0.0, [], 0])],
        [b"\xff", encode_seq(0), msgpack.packb([0.0, [], 0])],
        [b"kv", encode_seq(0), b"\xc1"],
        [b"kv", encode_seq(0), msgpack.packb({"ts": 0})],
        [b"kv", encode_seq(0), msgpack.packb([0.0, [{"type": "Nope"}], 0])],
        [
            b"kv",
            encode_seq(0),
            msgpack.packb(
                [0.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [1, 2], "block_size": 4}], 0]
            ),
        ],
        [b"kv", encode_seq(0), msgpack.packb([0.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}], 0])],
        [b"kv", encode_seq(0), msgpack.packb([True, [], 0])],
    ],
)
def test_malformed_messages_raise_wire_error(frames: list[bytes]) -> None:
    with pytest.raises(WireError):
        decode_message(frames)


_msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=_msgpack_values)
def test_any_msgpack_payload_decodes_or_raises_wire_error(value: object) -> None:
    with contextlib.suppress(WireError):
        decode_payload(msgpack.packb(value))


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64))
def test_any_bytes_decode_or_raise_wire_error(data: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_message([b"kv", encode_seq(0), data])
