"""The usage ledger over real HTTP on one gateway (memory store): its totals equal the sum of the
usage the replicas reported, per key, model and hour; the export as JSON, CSV and `kvgate usage`."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import orjson
import pytest

from gateway.auth_keys import hash_key
from gateway.cli import main
from tests.gateway.stack import chat
from tests.gateway.stores.fakes import FakeClock
from tests.gateway.tenancy_stack import ADMIN_KEY, auth, key_of, tenancy_stack, tenant

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
CI = {"authorization": "Bearer sk-ci"}
UNNAMED = "unnamed-" + hash_key(key_of("acme"))[7:15]


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


async def test_the_ledger_equals_what_the_replicas_reported(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock(utc("2026-12-03T10:15:00"))
    cfg = {
        "tenants": [tenant("acme", keys=[{"name": "ci-bot", "hash": hash_key("sk-ci")}]), tenant("globex")]
    }
    async with tenancy_stack(cfg, wall_clock=clock) as s:
        c = s.client
        reported: dict[tuple[str, str], list[int]] = {}  # (key, hour) -> requests, prompt, cached, output

        async def one(i: int, headers: dict[str, str], label: str) -> None:
            body = chat(f"question {i % 3} " * (1 + i % 4), max_tokens=3 + i % 5)  # repeats: cached tokens
            if i % 2:
                body = {**body, "stream": True, "stream_options": {"include_usage": True}}
                async with c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                    events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
                u = orjson.loads(events[-2][6:])["usage"]
            else:
                u = (await c.post("/v1/chat/completions", json=body, headers=headers)).json()["usage"]
            hour = "10" if clock.now < utc("2026-12-03T11:00:00") else "11"
            acc = reported.setdefault((label, hour), [0, 0, 0, 0])
            cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            for j, v in enumerate((1, u["prompt_tokens"], cached, u["completion_tokens"])):
                acc[j] += v

        await asyncio.gather(
            *(one(i, CI if i % 3 else auth("acme"), "ci-bot" if i % 3 else UNNAMED) for i in range(24))
        )
        clock.now = utc("2026-12-03T11:05:00")
        await asyncio.gather(*(one(i, CI, "ci-bot") for i in range(6)))
        await c.post("/v1/chat/completions", json=chat("hi"), headers=auth("globex"))

        r = await c.get(
            "/admin/usage",
            params={"tenant": "acme", "from": "2026-12-03", "to": "2026-12-03", "group_by": "hour"},
            headers=ADMIN,
        )
        assert r.status_code == 200, r.text
        report = r.json()
        got = {
            (row["key"], row["period"][11:13]): [
                row["requests"],
                row["prompt_tokens"],
                row["cached_tokens"],
                row["output_tokens"],
            ]
            for row in report["data"]
        }
        assert got == reported
        assert {row["model"] for row in report["data"]} == {"tiny-llama"} and report["timezone"] == "UTC"
        assert report["totals"]["requests"] == 30 and report["totals"]["estimated_requests"] == 0
        assert sum(v[2] for v in reported.values()) > 0  # the cached tokens are really there
        everyone = (
            await c.get("/admin/usage", params={"group_by": "total", "dims": "tenant"}, headers=ADMIN)
        ).json()
        assert [(row["tenant"], row["requests"]) for row in everyone["data"]] == [("acme", 30), ("globex", 1)]
        r = await c.get(
            "/admin/usage",
            params={
                "tenant": "acme",
                "key": "ci-bot",
                "format": "csv",
                "from": "2026-12-03",
                "to": "2026-12-03",
            },
            headers=ADMIN,
        )
        lines = r.text.splitlines()
        assert r.headers["content-type"].startswith("text/csv") and lines[0].startswith(
            "period,start,tenant,key"
        )
        assert lines[1].startswith("2026-12-03,2026-12-03T00:00:00+00:00,acme,ci-bot,tiny-llama,")
        requests = sum(v[0] for k, v in reported.items() if k[0] == "ci-bot")
        assert int(lines[1].split(",")[5]) == requests

        # `kvgate usage`: the same numbers as a table, over the admin API (run off the loop: it blocks)
        argv = [
            "usage",
            "--url",
            s.server.url,
            "--admin-key-env",
            "KVGATE_TEST_ADMIN",
            "--tenant",
            "acme",
            "--from",
            "2026-12-03",
            "--to",
            "2026-12-03",
        ]
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("KVGATE_TEST_ADMIN", ADMIN_KEY)
            assert await asyncio.to_thread(main, argv) == 0
            out = capsys.readouterr().out
            assert await asyncio.to_thread(main, [*argv, "--csv"]) == 0
            exported = capsys.readouterr().out.splitlines()  # the CSV export: one row per key that day
            assert exported[0] == lines[0] and len(exported) == 3 and lines[1] in exported
            mp.setenv("KVGATE_TEST_ADMIN", "sk-wrong")
            assert await asyncio.to_thread(main, argv) == 1
            assert "401: Incorrect admin key" in capsys.readouterr().err
        table = out.splitlines()
        assert table[0].startswith(
            "usage 2026-12-03T00:00:00+00:00 .. 2026-12-04T00:00:00+00:00 (UTC), by day"
        )
        assert table[1].split() == [
            "period",
            "tenant",
            "key",
            "model",
            "requests",
            "prompt",
            "cached",
            "output",
            "total",
            "estimated",
        ]
        total_line = table[-1].split()
        assert total_line[0] == "total" and total_line[1] == "30"
        assert f"{sum(v[1] for v in reported.values()):,}" == total_line[2]
