"""One structured line per proxied request: the `kvgate.access` logger, JSON, written when it ended.

Fields: `ts` (Unix seconds), `request_id`, `path`, `tenant` (null when unauthenticated), `model`
(as the client sent it), `pool`, `route` and `target` (null until routes resolve them), `replica`
(the last one tried), `status` (499: the client left or stopped reading), `stream`, `prompt_tokens`,
`completion_tokens`, `cached_tokens` (the replica's usage; null when it sent none), `dispatch_ms`
(from arrival to the first attempt's start: parsing, tokenizing, limits, flow control's queue and
routing; null when it never went out), `ttft_ms` and `duration_ms` (from arrival; null when nothing
was sent), `retries` (attempts after the first), `error` (the last upstream failure's kind, or
null), `predicted_ttft_ms` (the latency model's prediction for the last attempt, from its dispatch to
its first chunk; null when none was made) and `ttft_error` (|predicted - actual| / actual for a
stream whose prediction's inputs were fresh: what `kvgate_ttft_prediction_error_ratio` observed;
null otherwise). `ttft_ms - dispatch_ms` is the replicas' part of the first token's wait. Never a
key, a header value or the prompt.

Cost: one dict and one orjson encode per request, and the logging call; none when `server.access_log`
is off. `kvgate serve` sends the logger to stdout (gateway/server.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import orjson

from gateway.forwarder import Outcome

ACCESS_LOGGER = "kvgate.access"


class AccessLog:
    """Writes access lines when `enabled`. Stateless apart from the logger; safe to share."""

    __slots__ = ("_clock", "_log", "enabled")

    def __init__(
        self,
        enabled: bool,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.enabled = enabled
        self._log = logger or logging.getLogger(ACCESS_LOGGER)
        self._clock = clock

    def write(
        self,
        *,
        request_id: bytes,
        path: str,
        tenant: str | None,
        model: str | None,
        pool: str | None,
        status: int,
        stream: bool,
        outcome: Outcome,
        started: float,
        ended: float,
        route: str | None = None,
        target: str | None = None,
    ) -> None:
        """`started`/`ended` and the outcome's times are `time.perf_counter()` readings."""
        if not self.enabled or not self._log.isEnabledFor(logging.INFO):
            return
        usage = outcome.usage
        first, sent, predicted = outcome.first_byte_at, outcome.dispatched_at, outcome.predicted_ttft_s
        line = {
            "ts": round(self._clock(), 3),
            "request_id": request_id.decode("latin-1"),
            "path": path,
            "tenant": tenant,
            "model": model,
            "pool": pool,
            "route": route,
            "target": target,
            "replica": outcome.replica,
            "status": status,
            "stream": stream,
            "prompt_tokens": usage.prompt_tokens if usage is not None else None,
            "completion_tokens": usage.completion_tokens if usage is not None else None,
            "cached_tokens": usage.cached_tokens if usage is not None else None,
            "dispatch_ms": round((sent - started) * 1000, 2) if sent is not None else None,
            "ttft_ms": round((first - started) * 1000, 2) if first is not None else None,
            "duration_ms": round((ended - started) * 1000, 2),
            "retries": max(0, outcome.attempts - 1),
            "error": outcome.error_kind,
            "predicted_ttft_ms": round(predicted * 1000, 2) if predicted is not None else None,
            "ttft_error": round(outcome.ttft_error, 4) if outcome.ttft_error is not None else None,
        }
        self._log.info(orjson.dumps(line).decode())
