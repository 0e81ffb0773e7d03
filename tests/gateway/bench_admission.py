"""Admission overhead per request: authenticate + admit + settle, no network to replicas.

    python -m tests.gateway.bench_admission [--requests 20000] [--rounds 1]

Setups over the same 4-replica fleet picture (scraped, with room, flow control on): no tenants (the
open gateway); a limited tenant (rpm + tpm) on the memory store, with the usage ledger off (the
setup measured before quotas existed) and on (the default now); the same tenant with three quotas
(tokens per calendar month, requests per day in Europe/Berlin, tokens per day for a model pattern);
a named key with its own rpm and day quota on top of those (four buckets, four quotas); and the
limited tenant and the quota tenant on a private redis-server started here (needs `redis-server` on
PATH). Prints wall and CPU microseconds per request; with Redis the wall time is two loopback round
trips (reserve, settle), quotas riding in the same two calls. With `--rounds N` every setup runs N
times, round-robin, and the median of each is printed: on a shared machine whose load drifts, every
setup then meets the same mix of quiet and busy moments.
Not a test: numbers, for the report.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

from gateway.auth_keys import hash_key
from gateway.config import parse_config
from gateway.fleet.metrics_parse import ReplicaMetrics
from gateway.fleet.state import FleetState
from gateway.forwarder import Outcome
from gateway.metrics import GatewayMetrics
from gateway.sse_filter import Usage
from gateway.tenancy import Tenancy
from policies.types import RequestInfo
from tests.gateway.redis_server import RedisServer

INFO = RequestInfo(model="m", base_model="m", adapter=None, prompt_tokens=500, max_tokens=200)
REPLICAS = [{"url": f"http://r{i}:1", "model": "m", "name": f"r{i}"} for i in range(4)]
LIMITS = {"rpm": 10**9, "tpm": 10**12}
TENANT = {"name": "acme", "api_keys": [hash_key("k")], "limits": LIMITS}
QUOTAS = [
    {"tokens": 10**15, "per": "month", "warn_at": 0.8},
    {"requests": 10**12, "per": "day", "timezone": "Europe/Berlin"},
    {"tokens": 10**15, "per": "day", "models": ["m*"]},
]
QUOTA_TENANT = {**TENANT, "quotas": QUOTAS}
KEY_TENANT = {
    **QUOTA_TENANT,
    "api_keys": [],
    "keys": [{"name": "ci-bot", "hash": hash_key("k"), "limits": {"rpm": 10**9},
              "quotas": [{"tokens": 10**15, "per": "day"}]}],
}  # fmt: skip
NO_LEDGER = {"ledger": {"enabled": False}}


async def run(cfg: dict[str, Any], n: int, key: bytes | None) -> tuple[float, float]:
    config = parse_config({"replicas": REPLICAS, "fleet": {"stale_after_s": 3600}, **cfg})
    fleet = FleetState(config.replicas, config.fleet)
    for r in REPLICAS:
        fleet.record_scrape(r["name"], ReplicaMetrics(running=2, waiting=0, kv_usage=0.2))
    tenancy = Tenancy(config, fleet, GatewayMetrics())
    await tenancy.start()
    usage, outcome = Usage(500, 150), Outcome(status=200, attempts=1)
    try:
        for _ in range(200):  # warm up (script load, connections)
            t = tenancy.authenticate(key)
            await tenancy.settle(await tenancy.admit(t, INFO, None), usage, outcome)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            t = tenancy.authenticate(key)
            adm = await tenancy.admit(t, INFO, None)
            await tenancy.settle(adm, usage, outcome)
        return (time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6
    finally:
        await tenancy.stop()


async def main(n: int, rounds: int) -> None:
    print(f"{n} requests each, {rounds} round(s); load average {os.getloadavg()[0]:.2f}")
    setups: list[tuple[str, dict[str, Any], int]] = [
        ("no tenants (open gateway)", {}, n),
        ("tenant, memory, ledger off", {"tenants": [TENANT], **NO_LEDGER}, n),
        ("tenant, memory store", {"tenants": [TENANT]}, n),
        ("tenant + 3 quotas, memory", {"tenants": [QUOTA_TENANT]}, n),
        ("key + tenant, 4 quotas, memory", {"tenants": [KEY_TENANT]}, n),
    ]
    with RedisServer() as redis:
        state = {"state": {"store": redis.url, "timeout_s": 1.0}}
        setups += [
            ("tenant, redis store", {"tenants": [TENANT], **state}, n // 4),
            ("tenant + 3 quotas, redis", {"tenants": [QUOTA_TENANT], **state}, n // 4),
        ]
        results: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in setups}
        for _ in range(rounds):
            for name, cfg, count in setups:
                results[name].append(await run(cfg, count, None if not cfg else b"Bearer k"))
    for name, _, _ in setups:
        wall = statistics.median(w for w, _ in results[name])
        cpu = statistics.median(c for _, c in results[name])
        note = "  (this process only)" if "redis" in name else ""
        print(f"  {name:32s} wall {wall:8.1f} us   cpu {cpu:8.1f} us{note}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=1, help="run every setup this many times, round-robin")
    args = p.parse_args()
    asyncio.run(main(args.requests, args.rounds))
