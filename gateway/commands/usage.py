"""`kvgate usage --url URL --tenant NAME --from DATE --to DATE [...]`: the usage ledger as a table.

Reads `GET /admin/usage` of a running gateway with an admin key taken from an environment variable
(`--admin-key-env`, default KVGATE_ADMIN_KEY), so the key stays out of the shell history and the
process list. Through the gateway rather than from the store directly: it works alike with the
memory store (which only the gateway can see) and with Redis, the gateway flushes its own latest
usage before answering, and the operator needs an admin key, not the store's address and password.

    kvgate usage --url http://gw:8080 --tenant acme --from 2026-12-01 --to 2026-12-31 --group-by day
    kvgate usage --url http://gw:8080 --tenant acme --from 2026-12-01 --to 2026-12-31 --csv > acme.csv
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

_NUMBERS = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "total_tokens",
    "estimated_requests",
)
_HEADS = {"prompt_tokens": "prompt", "cached_tokens": "cached", "output_tokens": "output",
          "total_tokens": "total", "estimated_requests": "estimated"}  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="the gateway, e.g. http://127.0.0.1:8080")
    p.add_argument(
        "--admin-key-env", default="KVGATE_ADMIN_KEY", help="environment variable holding an admin key"
    )
    p.add_argument("--tenant", help="one tenant (default: every tenant)")
    p.add_argument("--key", help="one key: its name, unnamed-<hex>, or - for keyless requests")
    p.add_argument("--model", help="one model, as clients name it")
    p.add_argument(
        "--from", dest="start", help="first day (YYYY-MM-DD) or RFC 3339 time; default: this month"
    )
    p.add_argument("--to", dest="end", help="last day, included (YYYY-MM-DD), or RFC 3339 time; default: now")
    p.add_argument("--tz", help="time zone of the dates and of day/week/month groups (default UTC)")
    p.add_argument("--group-by", default="day", choices=("hour", "day", "week", "month", "total"))
    p.add_argument("--dims", help="which of tenant,key,model to keep apart (default: all three)")
    p.add_argument("--csv", action="store_true", help="print the CSV export instead of a table")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the gateway")


def run(args: argparse.Namespace) -> int:
    key = os.environ.get(args.admin_key_env)
    if not key:
        print(f"kvgate usage: set {args.admin_key_env} to an admin key", file=sys.stderr)
        return 2
    params = {
        "tenant": args.tenant, "key": args.key, "model": args.model, "from": args.start, "to": args.end,
        "tz": args.tz, "group_by": args.group_by, "dims": args.dims, "format": "csv" if args.csv else "json",
    }  # fmt: skip
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    req = urllib.request.Request(
        f"{args.url.rstrip('/')}/admin/usage?{query}", headers={"authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=args.timeout) as resp:
            body = resp.read().decode("utf-8")
    except urllib.error.HTTPError as err:
        print(f"kvgate usage: {err.code}: {_message(err.read())}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as err:
        print(f"kvgate usage: cannot reach {args.url}: {getattr(err, 'reason', err)}", file=sys.stderr)
        return 1
    if args.csv:
        sys.stdout.write(body)
        return 0
    report = json.loads(body)
    print(f"usage {report['from']} .. {report['to']} ({report['timezone']}), by {report['group_by']}")
    print(table(report["data"], report["totals"]))
    return 0


def _message(raw: bytes) -> str:
    try:
        return str(json.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", "replace")[:500]


def table(rows: list[dict[str, Any]], totals: dict[str, int]) -> str:
    """Rows as aligned text columns, numbers right-aligned with thousands separators, and a total."""
    labels = [c for c in ("period", "tenant", "key", "model") if not rows or c in rows[0]]
    heads = labels + [_HEADS.get(c, c) for c in _NUMBERS]
    lines = [[str(r.get(c, "")) for c in labels] + [f"{int(r[c]):,}" for c in _NUMBERS] for r in rows]
    lines.append(["total"] + [""] * (len(labels) - 1) + [f"{int(totals.get(c, 0)):,}" for c in _NUMBERS])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(heads)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < len(labels) else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(heads), rule, *(fmt(line) for line in lines[:-1]), rule, fmt(lines[-1])])
