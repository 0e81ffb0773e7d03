"""The real vLLM 0.32 KV-event capture (tests/fixtures/vllm-0.32-cpu/kv_events), as frames and JSON."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from tests.vllm_fixtures import VLLM_FIXTURES

KV_EVENTS = VLLM_FIXTURES / "kv_events"


@dataclass(frozen=True)
class CapturedMessage:
    frames: list[bytes]
    seq: int
    decoded: list[Any]  # [ts, events, rank] as the capture's own JSON decoding


def captured(name: str) -> list[CapturedMessage]:
    """`name` is "stored" or "evicted"."""
    out = []
    for line in (KV_EVENTS / f"{name}.jsonl").read_text().splitlines():
        row = json.loads(line)
        frames = [base64.b64decode(f) for f in row["frames_b64"]]
        out.append(CapturedMessage(frames=frames, seq=row["seq"], decoded=row["decoded"]))
    return out
