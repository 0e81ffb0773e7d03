"""Two kvgate worker processes on one port (`kvgate serve --workers 2`), over loopback HTTP: a request
lands on either, so every admin change must reach both (route weights, a tenant's limits and keys
through Redis; a replica drain and a reload through the worker channel), any /metrics scrape must
count both, and a tenant's limit is one limit across both (Redis)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from simulator.fleet import SimFleet
from tests.gateway.ab_stack import ADMIN, V2, route
from tests.gateway.redis_server import RedisServer, redis_server  # noqa: F401
from tests.gateway.stack import MODEL, chat, merge
from tests.gateway.tenancy_stack import auth, base_config, tenant
from tests.gateway.workers_process import each_worker, kvgate_workers, worker_dir

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="several workers need Linux (SO_REUSEPORT)")
FRESH = httpx.Limits(max_keepalive_connections=0)  # a new connection per request: either worker


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(replicas=2, profile="tiny", max_loras=2, adapters=("chat-v2",)) as f:
        yield f


def config(fleet: SimFleet, redis_url: str, **extra: Any) -> dict[str, Any]:
    return merge(
        base_config([(fleet, MODEL, "r")]),
        {
            "server": {"access_log": False, "drain_propagation_s": 0.2},
            "state": {"store": redis_url},
            "tenants": [tenant("acme"), tenant("bravo", limits={"rpm": 10})],
            **extra,
        },
    )


def own_counts(pid: int, name: str) -> list[float]:
    """Each worker's own total of the samples called `name`, from the samples it last gave."""
    out = []
    for i in range(2):
        doc = json.loads((worker_dir(pid) / f"metrics-w{i}.json").read_bytes())
        out.append(sum(v for fam in doc["families"] for s, _, v in fam[3] if s == name))
    return out


async def test_every_admin_change_reaches_both_workers(
    fleet: SimFleet,
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    cfg = config(fleet, redis_server.url, routes=[route()])
    async with (
        kvgate_workers(tmp_path, cfg) as kv,
        httpx.AsyncClient(base_url=kv.url, timeout=30, limits=FRESH) as c,
    ):
        # Route weights (Redis pub/sub).
        r = await c.put("/admin/routes/chat", json={"weights": {MODEL: 50, V2: 50}}, headers=ADMIN)
        assert r.status_code == 200, r.text
        await each_worker(
            kv.url, "/admin/routes/chat", ADMIN, lambda d: d["split"]["weights"] == {MODEL: 50, V2: 50}
        )
        # A tenant's limits and a new key (Redis pub/sub).
        r = await c.patch("/admin/tenants/acme", json={"limits": {"rpm": 77}}, headers=ADMIN)
        assert r.status_code == 200, r.text
        r = await c.post("/admin/tenants/acme/keys", json={"name": "ci"}, headers=ADMIN)
        assert r.status_code == 201, r.text
        key = r.json()["key"]
        await each_worker(
                kv.url, "/admin/tenants/acme", ADMIN,
                lambda d: d["limits"]["rpm"] == 77 and "ci" in {k["name"] for k in d["keys"]},
            )  # fmt: skip
        headers = {"authorization": f"Bearer {key}"}
        for _ in range(6):  # the new key works whichever worker takes it
            assert (await c.post("/v1/chat/completions", json=chat("hi"), headers=headers)).status_code == 200

        # A replica drain and undrain (the worker channel): applied by both before the answer.
        r = await c.post("/admin/replicas/r0/drain", headers=ADMIN)
        assert r.status_code == 200 and r.json()["workers"]["confirmed"] == [0, 1], r.text
        await each_worker(kv.url, "/admin/replicas", ADMIN, lambda d: _drained(d) == {"r0"}, timeout=5)
        for _ in range(6):
            r = await c.post("/v1/chat/completions", json=chat("hi"), headers=auth("acme"))
            assert r.headers["x-kvgate-replica"] == "r1"
        r = await c.delete("/admin/replicas/r0/drain", headers=ADMIN)
        assert r.json()["workers"] == {"count": 2, "confirmed": [0, 1], "pending": []}
        await each_worker(kv.url, "/admin/replicas", ADMIN, lambda d: _drained(d) == set(), timeout=5)

        # POST /admin/reload: every worker reads the file again.
        on_disk = yaml.safe_load(kv.proc.config_path.read_text())
        on_disk["tenants"][0]["limits"] = {"rpm": 55}
        kv.proc.config_path.write_text(yaml.safe_dump(on_disk))
        r = await c.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 200, r.text
        results = r.json()["workers"]
        assert set(results) == {"0", "1"} and all(v["reloaded"] for v in results.values()), r.text
        await each_worker(kv.url, "/admin/config", ADMIN, lambda d: d["generation"] == 2, timeout=5)


def _drained(doc: dict[str, Any]) -> set[str]:
    return {r["name"] for r in doc["data"] if r["drained"]}


async def test_any_scrape_counts_the_requests_of_both_workers(
    fleet: SimFleet,
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with kvgate_workers(tmp_path, config(fleet, redis_server.url)) as kv:
        async with httpx.AsyncClient(base_url=kv.url, timeout=30, limits=FRESH) as c:
            for _ in range(40):
                r = await c.post("/v1/chat/completions", json=chat("hi"), headers=auth("acme"))
                assert r.status_code == 200
            for _ in range(6):  # each scrape lands on either worker
                text = (await c.get("/metrics")).text
                assert 'kvgate_requests_total{model="tiny-llama",status="200"} 40.0' in text
                assert 'kvgate_admissions_total{band="standard",path="direct",tenant="acme"} 40.0' in text
                assert 'kvgate_workers{state="answered"} 2.0' in text
                assert 'kvgate_time_to_first_token_seconds_count{model="tiny-llama"} 40.0' in text
        mine = own_counts(kv.workers()[0], "kvgate_requests_total")
        assert sum(mine) == 40 and min(mine) > 0, mine  # both served some: the sum is a real sum


async def test_a_tenant_limit_is_one_limit_across_both_workers(
    fleet: SimFleet,
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with kvgate_workers(tmp_path, config(fleet, redis_server.url)) as kv:
        statuses = []
        async with httpx.AsyncClient(base_url=kv.url, timeout=30, limits=FRESH) as c:
            for _ in range(24):
                r = await c.post("/v1/chat/completions", json=chat("hi"), headers=auth("bravo"))
                statuses.append(r.status_code)
            await c.get("/metrics")
        # rpm 10: ten at once (one more may have refilled meanwhile), not ten per worker.
        assert 10 <= statuses.count(200) <= 11 and statuses.count(200) + statuses.count(429) == 24, statuses
        served = own_counts(kv.workers()[0], "kvgate_requests_total")
        assert min(served) > 0, served
