"""Reading a kvgate access log (gateway/access_log.py: one JSON object per line) back in a benchmark.

The load generator sends each request's spec id as `x-request-id`, which kvgate keeps in the line,
so a point's traces find their lines by id. Lines that are not JSON objects (a truncated last line
while the gateway still writes) are skipped.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import orjson


def ttft_errors(path: Path, request_ids: Collection[str]) -> list[float]:
    """The latency model's |predicted - actual| / actual TTFT (`ttft_error`) of the requests in
    `request_ids` that it scored, in the log's order."""
    errors: list[float] = []
    with path.open("rb") as f:
        for raw in f:
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(line, dict):
                continue
            error = line.get("ttft_error")
            if isinstance(error, bool) or not isinstance(error, (int, float)):
                continue  # not scored (null), or not a number
            if line.get("request_id") in request_ids:
                errors.append(float(error))
    return errors
