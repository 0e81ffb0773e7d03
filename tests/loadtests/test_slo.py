from __future__ import annotations

import pytest

from loadtests.slo import Slo, SloError, parse_slo


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ttft=1s", Slo(ttft_s=1.0)),
        ("ttft=1s,tpot=50ms", Slo(ttft_s=1.0, tpot_s=0.05)),
        (" TTFT = 250ms , e2e=10s ", Slo(ttft_s=0.25, e2e_s=10.0)),
        ("itl=0.2s,tpot=1.5ms", Slo(itl_s=0.2, tpot_s=0.0015)),
        ("e2e=1e1s", Slo(e2e_s=10.0)),
        ("ttft=.5S", Slo(ttft_s=0.5)),
    ],
)
def test_parse(text: str, expected: Slo) -> None:
    got = parse_slo(text)
    for field in ("ttft_s", "tpot_s", "e2e_s", "itl_s"):
        want = getattr(expected, field)
        assert getattr(got, field) == (pytest.approx(want) if want is not None else None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty SLO"),
        ("   ", "empty SLO"),
        ("ttft", "not key=value"),
        ("=1s", "not key=value"),
        ("latency=1s", "unknown SLO key 'latency'"),
        ("ttft=1s,ttft=2s", "given twice"),
        ("ttft=1", "has no unit"),
        ("ttft=1h", "unknown unit 'h'"),
        ("ttft=fast", "positive number with a unit"),
        ("ttft=-5ms", "positive number with a unit"),
        ("ttft=0ms", "greater than zero"),
        ("ttft=1s,", "not key=value"),
    ],
)
def test_errors_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(SloError, match=message):
        parse_slo(text)


def test_as_dict_and_str_round_trip() -> None:
    slo = parse_slo("ttft=1s,tpot=50ms")
    assert slo.as_dict() == {"ttft_s": 1.0, "tpot_s": pytest.approx(0.05)}
    assert str(slo) == "ttft=1s,tpot=50ms"
    assert parse_slo(str(slo)) == slo
