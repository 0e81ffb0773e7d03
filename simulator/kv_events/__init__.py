"""KV-cache events as vLLM publishes them (`--kv-events-config`): what the block manager records
(`log`, `events`), the msgpack wire format (`wire`) and the ZeroMQ publisher with its replay socket
(`publisher`). Where a consumer connects, and the defaults, are here.

Importing this package loads nothing heavy: the engine uses `log` and `events` without ZeroMQ.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TOPIC = ""
"""vLLM's `KVEventsConfig.topic` default: every message goes out under the empty topic."""
DEFAULT_BUFFER_STEPS = 10_000
"""vLLM's `KVEventsConfig.buffer_steps` default: the replay socket keeps the last 10,000 messages."""


@dataclass(frozen=True, slots=True)
class KVEventEndpoints:
    """Where one replica publishes: connect a SUB socket to `pub` (`tcp://host:port`), a DEALER (or
    REQ) to `replay`."""

    pub: str
    replay: str
