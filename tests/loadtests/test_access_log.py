"""Reading a gateway's access log back: the latency model's errors of a point's requests, by id."""

from __future__ import annotations

from pathlib import Path

import orjson

from loadtests.access_log import ttft_errors
from loadtests.measures import prediction_errors


def _line(rid: str, error: float | None, **extra: object) -> bytes:
    return orjson.dumps({"request_id": rid, "stream": True, "ttft_error": error, **extra}) + b"\n"


def test_errors_of_the_given_ids_only_and_unscored_lines_skipped(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    log.write_bytes(
        _line("sp-0-1", 0.25)
        + _line("sp-0-2", None)  # not scored: stale inputs, or no stream
        + _line("warm-1", 0.9)  # another point's (or the warm-up's) request
        + b"not json\n"
        + b"[1, 2]\n"
        + _line("sp-1-0", 0)
        + _line("sp-1-1", True)  # not a number: skipped (a bool is an int to Python)
        + b'{"request_id": "sp-2-0", "ttft_err'  # the last line, half written
    )
    ids = {"sp-0-1", "sp-0-2", "sp-1-0", "sp-1-1", "sp-2-0"}
    assert ttft_errors(log, ids) == [0.25, 0.0]


def test_prediction_errors_are_nearest_rank_quantiles() -> None:
    assert prediction_errors([]) == {"n": 0, "p50": None, "p90": None}
    assert prediction_errors([0.3, 0.1, 0.2]) == {"n": 3, "p50": 0.2, "p90": 0.3}
    ten = [i / 10 for i in range(10, 0, -1)]
    assert prediction_errors(ten) == {"n": 10, "p50": 0.5, "p90": 1.0}
