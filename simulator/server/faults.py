"""Faults on demand, per replica: errors before the first byte, slowdown, crash or hang mid-stream,
failing health.

`FaultConfig` is the frozen description (start-up flags, Python args, the admin endpoint's JSON);
`FaultState` holds the replica's current config and its seeded random source for the error draws.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FaultConfig:
    """What is broken on one replica. The defaults break nothing.

    - `error_rate` in [0, 1]: that fraction of generation requests is answered `error_status` (500 or 503)
      before the first byte.
    - `slowdown` > 0 multiplies every engine step's duration (2.0 = twice as slow).
    - `crash_after_chunks` = k: a generation request's connection is dropped abruptly (no clean end) after
      k stream chunks (k = 0: before any byte; non-streaming: once the engine made k tokens).
    - `hang_after_chunks` = k: after k chunks the response stalls until the client gives up
      (k = 0: the request is accepted and never answered).
    - `health_status`: what `GET /health` answers (200 healthy, e.g. 503 failing).
    """

    error_rate: float = 0.0
    error_status: int = 500
    slowdown: float = 1.0
    crash_after_chunks: int | None = None
    hang_after_chunks: int | None = None
    health_status: int = 200

    def __post_init__(self) -> None:
        if isinstance(self.error_rate, bool) or not isinstance(self.error_rate, (int, float)) \
                or not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"error_rate must be a number in [0, 1], got {self.error_rate!r}")
        if self.error_status not in (500, 502, 503, 504):
            raise ValueError(f"error_status must be one of 500, 502, 503, 504, got {self.error_status!r}")
        if isinstance(self.slowdown, bool) or not isinstance(self.slowdown, (int, float)) \
                or not self.slowdown > 0:
            raise ValueError(f"slowdown must be a number > 0, got {self.slowdown!r}")
        for name in ("crash_after_chunks", "hang_after_chunks"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be null or an integer >= 0, got {value!r}")
        if isinstance(self.health_status, bool) or not isinstance(self.health_status, int) \
                or not 200 <= self.health_status <= 599:
            raise ValueError(f"health_status must be an HTTP status, got {self.health_status!r}")

    def merged(self, changes: Mapping[str, Any]) -> FaultConfig:
        """This config with `changes` applied; `ValueError` names an unknown field or a bad value."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown fault field(s): {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(known))}")
        return dataclasses.replace(self, **dict(changes))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class FaultState:
    """A replica's current faults. Read on the request path; replaced whole by the admin endpoint.

    Single-threaded: used from the replica's event loop only (the fleet's thread handle hops onto it).
    """

    def __init__(self, config: FaultConfig | None = None, seed: int = 0) -> None:
        self.config = config if config is not None else FaultConfig()
        self._rng = random.Random(seed)

    def draw_error(self) -> int | None:
        """The status to fail this generation request with, or None to serve it."""
        rate = self.config.error_rate
        if rate and self._rng.random() < rate:
            return self.config.error_status
        return None
