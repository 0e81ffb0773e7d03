"""vLLM's KV-event messages on the wire (the simulator's encoder; the gateway has its own decoder).

A message is three ZeroMQ frames `[topic, sequence, payload]`: the topic as UTF-8, the sequence as 8
bytes big-endian, and the payload as msgpack of the batch `[ts, events, data_parallel_rank]` with each
event a tagged map (`KVEvent.to_wire`). Encoding vLLM 0.32's captured events this way gives the
captured bytes exactly. The replay socket answers with `[sequence, payload]` after the requester's
routing frames, and ends with `REPLAY_END` and an empty payload.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgpack

from simulator.kv_events.events import KVEvent

REPLAY_END = -1
SEQ_BYTES = 8


def encode_seq(seq: int) -> bytes:
    """8-byte big-endian signed: sequences count from 0; -1 ends a replay."""
    return seq.to_bytes(SEQ_BYTES, "big", signed=True)


def decode_replay_start(frame: bytes) -> int:
    """The first sequence a replay request asks for: the frame read as big-endian unsigned, as vLLM
    reads it (so a negative start asks for nothing but the end marker)."""
    return int.from_bytes(frame, "big")


def encode_payload(ts: float, events: Sequence[KVEvent], data_parallel_rank: int = 0) -> bytes:
    """msgpack of one batch; `ts` is wall-clock seconds (vLLM: `time.time()` when the batch is made)."""
    batch = [float(ts), [event.to_wire() for event in events], data_parallel_rank]
    packed: bytes = msgpack.packb(batch, use_bin_type=True)
    return packed
