"""Where the usage ledger lives: this process's memory (one gateway) or Redis hashes (shared).

Rows are whole numbers per (tenant, hour) and (key, model): `METRICS` in that order. Hours are UTC
hours, named by their start in Unix seconds (a multiple of 3600).

Redis: one hash per tenant and hour, `{key_prefix}{<tenant>}:usage:<hour>` (the tenant's hash tag, as
its buckets), fields `<key>:<metric>:<model>` (key labels never hold a colon; a model name may, and
is the rest of the field). Each hash expires `retention_days` after its hour ends. A flush is one
pipeline of one `ledger.lua` call per tenant, each applied at most once per batch id, so a flush
retried after a lost answer never counts twice. Calls are bounded by the ledger's own timeout (it is
off the request path: longer than the buckets').
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError

METRICS = ("requests", "prompt_tokens", "cached_tokens", "output_tokens", "estimated_requests")
HOUR_S = 3600
_MARKER_TTL_S = 86_400
SCRIPT = resources.files("gateway.stores").joinpath("ledger.lua").read_text(encoding="utf-8")

Slot = tuple[str, int]  # (tenant, hour start)
Cell = tuple[str, str]  # (key label, model)
Rows = Mapping[Slot, Mapping[Cell, Sequence[int]]]
Row = tuple[int, str, str, tuple[int, ...]]  # (hour, key, model, METRICS values)


class LedgerStore(Protocol):
    async def add(self, batch_id: str, rows: Rows) -> None:
        """Add `rows` to the ledger, once per `batch_id`. Raises on failure (the caller retries)."""

    async def read(self, tenant: str, start_hour: int, end_hour: int) -> list[Row]:
        """`tenant`'s rows for the hours in `[start_hour, end_hour)`."""

    async def close(self) -> None: ...


class MemoryLedgerStore:
    """The ledger of one gateway process; hours past retention are dropped at each add."""

    def __init__(self, retention_days: int, wall_clock: Callable[[], float] = time.time) -> None:
        self._rows: dict[Slot, dict[Cell, list[int]]] = {}
        self._retention_s = retention_days * 86_400
        self._wall = wall_clock

    async def add(self, batch_id: str, rows: Rows) -> None:
        for slot, cells in rows.items():
            held = self._rows.setdefault(slot, {})
            for cell, values in cells.items():
                have = held.get(cell)
                if have is None:
                    held[cell] = list(values)
                else:
                    for i, v in enumerate(values):
                        have[i] += v
        horizon = self._wall() - self._retention_s
        for slot in [s for s in self._rows if s[1] + HOUR_S <= horizon]:
            del self._rows[slot]

    async def read(self, tenant: str, start_hour: int, end_hour: int) -> list[Row]:
        out = []
        for (t, hour), cells in self._rows.items():
            if t == tenant and start_hour <= hour < end_hour:
                out += [(hour, key, model, tuple(v)) for (key, model), v in cells.items()]
        return out

    async def close(self) -> None:
        return None


class RedisLedgerStore:
    def __init__(
        self, client: aioredis.Redis, *, key_prefix: str, retention_days: int, timeout_s: float
    ) -> None:
        self._r = client
        self._prefix = key_prefix
        self._retention_s = retention_days * 86_400
        self._timeout_s = timeout_s
        self._sha: str | None = None

    @classmethod
    def from_url(
        cls, url: str, *, key_prefix: str, retention_days: int, timeout_s: float
    ) -> RedisLedgerStore:
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            max_connections=16,
        )
        return cls(client, key_prefix=key_prefix, retention_days=retention_days, timeout_s=timeout_s)

    def hour_key(self, tenant: str, hour: int) -> str:
        return f"{self._prefix}{{{tenant}}}:usage:{hour}"

    async def add(self, batch_id: str, rows: Rows) -> None:
        by_tenant: dict[str, list[tuple[int, Mapping[Cell, Sequence[int]]]]] = {}
        for (tenant, hour), cells in rows.items():
            by_tenant.setdefault(tenant, []).append((hour, cells))
        calls: list[tuple[list[str], list[Any]]] = []
        for tenant, hours in by_tenant.items():
            keys = [f"{self._prefix}{{{tenant}}}:usage:batch:{batch_id}"]
            args: list[Any] = [_MARKER_TTL_S]
            for hour, cells in hours:
                keys.append(self.hour_key(tenant, hour))
                fields: list[Any] = []
                for (key, model), values in cells.items():
                    for name, v in zip(METRICS, values, strict=True):
                        if v:
                            fields += (f"{key}:{name}:{model}", v)
                args += (hour + HOUR_S + self._retention_s, len(fields) // 2, *fields)
            calls.append((keys, args))
        async with asyncio.timeout(self._timeout_s):
            if self._sha is None:
                self._sha = await self._r.script_load(SCRIPT)
            try:
                await self._run(calls)
            except NoScriptError:  # the server restarted or flushed its scripts: retry the same batch
                self._sha = await self._r.script_load(SCRIPT)
                await self._run(calls)

    async def _run(self, calls: list[tuple[list[str], list[Any]]]) -> None:
        assert self._sha is not None
        async with self._r.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                pipe.evalsha(self._sha, len(keys), *keys, *args)
            await pipe.execute()

    async def read(self, tenant: str, start_hour: int, end_hour: int) -> list[Row]:
        hours = list(range(start_hour - start_hour % HOUR_S, end_hour, HOUR_S))
        out: list[Row] = []
        async with asyncio.timeout(max(self._timeout_s, 10.0)):
            for i in range(0, len(hours), 500):  # a year is ~8,800 hashes: a few pipelines
                chunk = [h for h in hours[i : i + 500] if h >= start_hour]
                async with self._r.pipeline(transaction=False) as pipe:
                    for h in chunk:
                        pipe.hgetall(self.hour_key(tenant, h))
                    replies = await pipe.execute()
                for h, fields in zip(chunk, replies, strict=True):
                    out += _rows_of(h, fields)
        return out

    async def close(self) -> None:
        await self._r.aclose()


def _rows_of(hour: int, fields: Mapping[bytes, bytes]) -> list[Row]:
    cells: dict[Cell, list[int]] = {}
    index = {name: i for i, name in enumerate(METRICS)}
    for f, v in fields.items():
        key, name, model = f.decode().split(":", 2)
        i = index.get(name)
        if i is None:
            continue
        cells.setdefault((key, model), [0] * len(METRICS))[i] += int(v)
    return [(hour, key, model, tuple(values)) for (key, model), values in cells.items()]
