"""`kvgate serve --workers 2` as real processes over loopback HTTP: the supervisor starts the workers,
starts again one that dies, passes SIGTERM and SIGHUP on to every worker, exits 0 after they all
drained and non-zero when they keep dying; a config that would multiply the limits is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from simulator.fleet import SimFleet
from tests.gateway.ab_stack import ADMIN
from tests.gateway.redis_server import RedisServer, redis_server  # noqa: F401
from tests.gateway.serve_process import ROOT
from tests.gateway.stack import MODEL, chat, merge
from tests.gateway.tenancy_stack import base_config
from tests.gateway.workers_process import alive, each_worker, kvgate_workers, worker_dir

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="several workers need Linux (SO_REUSEPORT)")


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet(replicas=2, profile="tiny") as f:
        yield f


def workers_config(fleet: SimFleet, redis_url: str, **extra: Any) -> dict[str, Any]:
    return merge(
        base_config([(fleet, MODEL, "r")]),
        {
            "server": {"access_log": False, "drain_propagation_s": 0.2, "drain_timeout_s": 10},
            "state": {"store": redis_url},
            **extra,
        },
    )


async def test_a_worker_that_dies_is_started_again_and_its_counts_stay_in_metrics(
    fleet: SimFleet,
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with kvgate_workers(tmp_path, workers_config(fleet, redis_server.url)) as kv:
        before = kv.workers()
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=kv.url, timeout=30, limits=limits) as c:
            for _ in range(10):
                assert (await c.post("/v1/chat/completions", json=chat("hi"))).status_code == 200
            await c.get("/metrics")  # every worker saves the samples it gave
            assert (await c.post("/admin/replicas/r0/drain", headers=ADMIN)).status_code == 200
            victim = before[0]
            os.kill(victim, signal.SIGKILL)
            after = await kv.wait_workers(2, other_than=frozenset({victim}))
            assert before[1] in after  # the other worker was left alone
            # Both serve again, the new one with the drain it learnt from the other at start.
            drained = await each_worker(kv.url, "/admin/replicas", ADMIN, lambda doc: True)
            for doc in drained.values():
                assert {r["name"]: r["drained"] for r in doc["data"]} == {"r0": True, "r1": False}
            unauthorized = await c.get("/admin/replicas")
            assert unauthorized.status_code == 401 and "x-kvgate-worker" not in unauthorized.headers
            text = (await c.get("/metrics")).text
        assert 'kvgate_requests_total{model="tiny-llama",status="200"} 10.0' in text
        assert 'kvgate_workers{state="exited"} 1.0' in text
        assert "worker 0" in kv.proc.output() or "worker 1" in kv.proc.output()
        assert "exited unexpectedly" in kv.proc.output()


async def test_sigterm_drains_every_worker_and_the_supervisor_exits_0(
    fleet: SimFleet,
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with kvgate_workers(tmp_path, workers_config(fleet, redis_server.url)) as kv:
        pids = kv.workers()
        wdir = worker_dir(pids[0])
        kv.proc.signal(signal.SIGTERM)
        assert await kv.proc.wait(timeout=30) == 0, kv.proc.output()
        assert not [p for p in pids if alive(p)]
        assert kv.proc.output().count("drain: done") == 2
        assert not wdir.exists()  # the workers' directory goes with the supervisor


async def test_sighup_reloads_every_worker(
    fleet: SimFleet,
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    cfg = workers_config(fleet, redis_server.url)
    async with kvgate_workers(tmp_path, cfg) as kv:
        first = await each_worker(kv.url, "/admin/config", ADMIN, lambda doc: doc["generation"] == 1)
        on_disk = yaml.safe_load(kv.proc.config_path.read_text())
        on_disk["server"]["debug_headers"] = True
        kv.proc.config_path.write_text(yaml.safe_dump(on_disk))
        kv.proc.signal(signal.SIGHUP)
        after = await each_worker(kv.url, "/admin/config", ADMIN, lambda doc: doc["generation"] == 2)
        assert {d["hash"] for d in after.values()} != {d["hash"] for d in first.values()}
        assert len({d["hash"] for d in after.values()}) == 1  # the same config in both


async def test_workers_that_keep_dying_make_the_supervisor_give_up_with_status_1(
    fleet: SimFleet,
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with kvgate_workers(tmp_path, workers_config(fleet, redis_server.url)) as kv:
        killed: set[int] = set()
        while len(killed) < 6:  # the supervisor gives up past five unexpected exits a minute
            pids = await kv.wait_workers(2, other_than=frozenset(killed))
            killed.add(pids[0])
            os.kill(pids[0], signal.SIGKILL)
        assert await kv.proc.wait(timeout=30) == 1, kv.proc.output()
        assert "giving up" in kv.proc.output()
        assert not [p for p in kv.seen if alive(p)]


def test_several_workers_with_in_memory_limits_are_refused_and_why(tmp_path: Path) -> None:
    cfg = tmp_path / "kvgate.yaml"
    cfg.write_text(yaml.safe_dump({"replicas": [{"url": "http://127.0.0.1:9", "model": MODEL}]}))
    run = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg), "--workers", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2
    assert "state.store" in run.stderr and "multiplying every tenant's limits by 3" in run.stderr
    cfg.write_text(yaml.safe_dump({"server": {"workers": 2}}))
    check = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check-config", str(cfg)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert check.returncode == 1
    assert "server.workers" in check.stderr and "memory://" in check.stderr
