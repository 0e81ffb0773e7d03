"""The config in force: an immutable snapshot, replaced whole by a reload, never changed in place.

The Gateway holds the current one in a plain attribute (`Gateway.snapshot`); a request reads it once
when it arrives and keeps that object to its end, so a reload never changes a request half-way, and
reading it costs one attribute load, no lock (the swap is one assignment on the event loop's thread).

`generation` counts the configs this process has put in force (1 = the one it started with); `digest`
identifies the content: 16 hex digits of SHA-256 over the validated config in a canonical JSON form,
so two gateways that loaded the same settings show the same digest, whatever the file's comments,
key order or layout.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import orjson

from gateway.config import Config


def config_digest(config: Config) -> str:
    """16 hex digits identifying the config's settings (not its text)."""
    canonical = orjson.dumps(config.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class ConfigSnapshot:
    """One config in force. `loaded_at` is Unix seconds; `session_header` is the request header
    (lower case, bytes) that names a session, derived once here rather than on every request."""

    config: Config
    generation: int
    digest: str
    loaded_at: float
    session_header: bytes

    @classmethod
    def of(cls, config: Config, generation: int, loaded_at: float | None = None) -> ConfigSnapshot:
        return cls(
            config=config,
            generation=generation,
            digest=config_digest(config),
            loaded_at=time.time() if loaded_at is None else loaded_at,
            session_header=config.scheduling.session_header.lower().encode("latin-1"),
        )
