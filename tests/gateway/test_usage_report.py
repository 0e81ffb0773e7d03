"""gateway/usage_report.py: every query parameter checked (a 400 naming it), dates in a zone with
`to` inclusive, groups by hour/day/week/month/total, dims, CSV."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.usage_report import BadQuery, group, parse_query, to_csv, totals
from policies.quota_window import zone

NOW = datetime(2026, 12, 20, 12, tzinfo=UTC).timestamp()
TENANTS = ["acme", "globex"]


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@pytest.mark.parametrize(
    ("params", "param", "text"),
    [
        ({"tz": "Mars/Base"}, "tz", "unknown time zone"),
        ({"group_by": "year"}, "group_by", "one of hour, day, week, month, total"),
        ({"dims": "tenant,colour"}, "dims", "dims must be"),
        ({"dims": "key,key"}, "dims", "distinct"),
        ({"format": "xml"}, "format", "json or csv"),
        ({"from": "yesterday"}, "from", "a date (YYYY-MM-DD)"),
        ({"from": "2026-13-01"}, "from", "a date"),
        ({"from": "2026-12-10", "to": "2026-12-09"}, "to", "after"),
        ({"from": "2025-01-01", "to": "2026-12-01"}, "to", "at most 400 days"),
        ({"tenant": ""}, "tenant", "a tenant name"),
        ({"tenant": "a}b{"}, "tenant", "a tenant name"),
        ({"tenants": "acme"}, "tenants", "unknown query parameter"),
    ],
)
def test_bad_parameters_name_themselves(params: dict[str, str], param: str, text: str) -> None:
    with pytest.raises(BadQuery) as err:
        parse_query(params, TENANTS, NOW)
    assert err.value.param == param and text in str(err.value)


def test_dates_are_whole_days_in_the_zone_and_to_is_inclusive() -> None:
    q = parse_query({"from": "2026-12-01", "to": "2026-12-31", "tz": "Europe/Berlin"}, TENANTS, NOW)
    assert q.start == ts("2026-12-01T00:00:00+01:00") and q.end == ts("2027-01-01T00:00:00+01:00")
    assert q.tenants == ("acme", "globex") and q.group_by == "day" and not q.csv
    q = parse_query(
        {"from": "2026-12-01T10:00:00Z", "to": "2026-12-01T12:00:00Z", "tenant": "acme"}, TENANTS, NOW
    )
    assert (q.start, q.end, q.tenants) == (
        ts("2026-12-01T10:00:00+00:00"),
        ts("2026-12-01T12:00:00+00:00"),
        ("acme",),
    )
    q = parse_query({}, TENANTS, NOW, accept="text/csv")  # default: this month so far
    assert q.start == ts("2026-12-01T00:00:00+00:00") and q.end == NOW and q.csv


ROWS = [  # (tenant, hour, key, model, values)
    (
        "acme",
        int(ts("2026-12-01T22:00:00+00:00")),
        "ci-bot",
        "m",
        (1, 10, 2, 5, 0),
    ),  # Dec 1 in Berlin (23:00)
    ("acme", int(ts("2026-12-01T23:00:00+00:00")), "ci-bot", "m", (2, 20, 0, 6, 1)),  # Dec 2 in Berlin
    ("acme", int(ts("2026-12-02T09:00:00+00:00")), "-", "m", (1, 1, 0, 1, 0)),
    ("acme", int(ts("2026-12-02T09:00:00+00:00")), "ci-bot", "n", (1, 3, 0, 3, 0)),
]


def test_groups_follow_the_zone_and_dims_sum_the_rest() -> None:
    q = parse_query({"from": "2026-12-01", "to": "2026-12-02", "tz": "Europe/Berlin"}, TENANTS, NOW)
    rows = group(q, ROWS)
    assert [(r["period"], r["key"], r["model"], r["requests"]) for r in rows] == [
        ("2026-12-01", "ci-bot", "m", 1),
        ("2026-12-02", "-", "m", 1),
        ("2026-12-02", "ci-bot", "m", 2),
        ("2026-12-02", "ci-bot", "n", 1),
    ]
    assert rows[0]["start"] == "2026-12-01T00:00:00+01:00" and rows[0]["total_tokens"] == 15
    q = parse_query(
        {"from": "2026-12-01", "to": "2026-12-02", "dims": "tenant", "group_by": "month"}, TENANTS, NOW
    )
    (only,) = group(q, ROWS)
    assert only["period"] == "2026-12" and "key" not in only and only["requests"] == 5
    assert totals([only]) == {
        "requests": 5,
        "prompt_tokens": 34,
        "cached_tokens": 2,
        "output_tokens": 15,
        "total_tokens": 49,
        "estimated_requests": 1,
    }
    q = parse_query(
        {
            "from": "2026-12-01",
            "to": "2026-12-02",
            "key": "ci-bot",
            "model": "m",
            "group_by": "hour",
            "dims": "key",
        },
        TENANTS,
        NOW,
    )
    assert [(r["period"], r["requests"]) for r in group(q, ROWS)] == [
        ("2026-12-01T22:00:00+00:00", 1),
        ("2026-12-01T23:00:00+00:00", 2),
    ]
    q = parse_query(
        {"from": "2026-11-30", "to": "2026-12-06", "group_by": "week", "dims": "model"}, TENANTS, NOW
    )
    assert [(r["period"], r["model"]) for r in group(q, ROWS)] == [("2026-W49", "m"), ("2026-W49", "n")]


def test_csv_has_a_header_and_one_line_per_row() -> None:
    q = parse_query(
        {"from": "2026-12-01", "to": "2026-12-02", "group_by": "total", "format": "csv"}, TENANTS, NOW
    )
    text = to_csv(q, group(q, ROWS))
    lines = text.splitlines()
    assert lines[0] == (
        "period,start,tenant,key,model,requests,prompt_tokens,cached_tokens,output_tokens,"
        "total_tokens,estimated_requests"
    )
    assert lines[1] == "total,2026-12-01T00:00:00+00:00,acme,-,m,1,1,0,1,2,0" and len(lines) == 4
    assert zone("UTC").key == "UTC"
