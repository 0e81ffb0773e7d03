"""`GET /admin/usage`: the usage ledger for chargeback, grouped by period, as JSON or CSV.

Query parameters (all optional):

    tenant    a tenant name (default: every tenant in the config)
    key       a key label: its name, `unnamed-<hex>` for a key given by hash, `-` for keyless requests
    model     the model name as clients sent it
    from, to  dates `YYYY-MM-DD` in `tz` (`to` includes that whole day) or RFC 3339 instants (`to`
              excluded); default: from the start of this month (in `tz`) to now
    tz        IANA time zone for dates and for day, week and month groups (default UTC)
    group_by  hour | day | week | month | total (default day)
    dims      which of tenant,key,model to keep apart (default all three); the rest are summed
    format    json (default) or csv (also chosen by `Accept: text/csv`)

The ledger keeps UTC hours; a group holds the hours that START inside it, so in a zone with a
half-hour offset a day's first half hour is counted in the day before. A range is at most
`MAX_DAYS` long. Every value a client sends is checked; a bad one is a 400 naming the parameter.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any
from zoneinfo import ZoneInfo

from gateway.config_tenancy import NAME_PATTERN
from policies.quota_window import Period, iso_local, local_midnight, window_at, zone

GROUPS = ("hour", "day", "week", "month", "total")
DIMS = ("tenant", "key", "model")
COLUMNS = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "total_tokens",
    "estimated_requests",
)
MAX_DAYS = 400
_NAME = re.compile(NAME_PATTERN.strip("^$"))


class BadQuery(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class UsageQuery:
    tenants: tuple[str, ...]
    key: str | None
    model: str | None
    start: float  # Unix seconds, included
    end: float  # excluded
    tz: ZoneInfo
    group_by: str
    dims: tuple[str, ...]
    csv: bool


def parse_query(
    params: Mapping[str, str], known_tenants: Sequence[str], now: float, accept: str = ""
) -> UsageQuery:
    extra = sorted(set(params) - {"tenant", "key", "model", "from", "to", "tz", "group_by", "dims", "format"})
    if extra:
        raise BadQuery(extra[0], f"unknown query parameter {extra[0]!r}")
    try:
        tz = zone(params.get("tz", "UTC"))
    except ValueError as err:
        raise BadQuery("tz", str(err)) from None
    tenant = params.get("tenant")
    if tenant is not None and not _NAME.fullmatch(tenant):
        raise BadQuery("tenant", "tenant must be a tenant name (letters, digits, '.', '_', '-')")
    group_by = params.get("group_by", "day")
    if group_by not in GROUPS:
        raise BadQuery("group_by", f"group_by must be one of {', '.join(GROUPS)}")
    dims = tuple(d.strip() for d in params.get("dims", ",".join(DIMS)).split(",") if d.strip())
    if any(d not in DIMS for d in dims) or len(set(dims)) != len(dims):
        raise BadQuery("dims", f"dims must be distinct names among {', '.join(DIMS)}")
    fmt = params.get("format", "csv" if "text/csv" in accept else "json")
    if fmt not in ("json", "csv"):
        raise BadQuery("format", "format must be json or csv")
    month_start = window_at("month", tz, now).start
    start = _instant(params["from"], tz, "from", end=False) if "from" in params else month_start
    end = _instant(params["to"], tz, "to", end=True) if "to" in params else now
    if not start < end:
        raise BadQuery("to", "`to` must be after `from`")
    if end - start > MAX_DAYS * 86_400:
        raise BadQuery("to", f"a range is at most {MAX_DAYS} days")
    return UsageQuery(
        tenants=(tenant,) if tenant is not None else tuple(known_tenants),
        key=params.get("key"),
        model=params.get("model"),
        start=start,
        end=end,
        tz=tz,
        group_by=group_by,
        dims=dims,
        csv=fmt == "csv",
    )


def _instant(text: str, tz: ZoneInfo, param: str, *, end: bool) -> float:
    try:
        if len(text) == 10:
            d = date.fromisoformat(text)
            return local_midnight(date.fromordinal(d.toordinal() + 1) if end else d, tz)
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadQuery(
            param, f"{param} must be a date (YYYY-MM-DD) or an RFC 3339 time, got {text!r}"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=tz)
    return t.timestamp()


def _period(group_by: str, tz: ZoneInfo, hour: int, q: UsageQuery) -> tuple[str, float]:
    """The group's label and start (Unix seconds) for the UTC hour starting at `hour`."""
    if group_by == "hour":
        return iso_local(hour, tz), float(hour)
    if group_by == "total":
        return "total", q.start
    period: Period = group_by  # type: ignore[assignment]  # day | week | month, checked at parse
    w = window_at(period, tz, hour)
    return w.label, w.start


def group(q: UsageQuery, rows: Sequence[tuple[str, int, str, str, tuple[int, ...]]]) -> list[dict[str, Any]]:
    """`rows` (tenant, hour, key, model, values in ledger order) filtered and summed into groups,
    sorted by period, then tenant, key, model."""
    sums: dict[tuple[Any, ...], list[int]] = {}
    starts: dict[str, float] = {}
    for tenant, hour, key, model, values in rows:
        if (q.key is not None and key != q.key) or (q.model is not None and model != q.model):
            continue
        label, start = _period(q.group_by, q.tz, hour, q)
        starts[label] = start
        dims = {"tenant": tenant, "key": key, "model": model}
        k = (label, *(dims[d] for d in q.dims))
        acc = sums.setdefault(k, [0] * 5)
        for i, n in enumerate(values):
            acc[i] += n
    out = []
    for k in sorted(sums, key=lambda k: (starts[k[0]], *k[1:])):
        v = sums[k]
        row: dict[str, Any] = {"period": k[0], "start": iso_local(starts[k[0]], q.tz)}
        row.update(zip(q.dims, k[1:], strict=True))
        row.update(
            requests=v[0], prompt_tokens=v[1], cached_tokens=v[2], output_tokens=v[3],
            total_tokens=v[1] + v[3], estimated_requests=v[4],
        )  # fmt: skip
        out.append(row)
    return out


def totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    return {c: sum(int(r[c]) for r in rows) for c in COLUMNS}


def to_csv(q: UsageQuery, rows: Sequence[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    header = ["period", "start", *q.dims, *COLUMNS]
    w.writerow(header)
    for r in rows:
        w.writerow([r[c] for c in header])
    return buf.getvalue()
