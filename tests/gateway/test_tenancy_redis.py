"""Shared limits through a real private Redis: two kvgate PROCESSES (`python -m gateway.cli serve`)
in front of one simulated fleet enforce one tenant limit together; Redis killed mid-run gives each
fail mode its configured behaviour and crashes nothing; when Redis is back, limits are shared again.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from simulator.fleet import SimFleet
from tests.gateway.redis_server import RedisServer, free_port, redis_server  # noqa: F401
from tests.gateway.stack import MODEL, chat, merge, metric_value, wait_for
from tests.gateway.tenancy_stack import ADMIN_KEY, auth, base_config, tenancy_stack, tenant

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
BURST = 20
# One request per minute, a bucket of 20: over a test it refills far less than one request, so the
# number of requests admitted is exact.
ACME = tenant("acme", limits={"rpm": 1, "rpm_burst": BURST})


def state(url: str, mode: str, gateways: int = 2, timeout_s: float = 1.0) -> dict[str, Any]:
    return {
        "store": url,
        "on_store_error": mode,
        "gateways": gateways,
        "timeout_s": timeout_s,
        "probe_min_s": 0.1,
        "probe_max_s": 0.5,
    }


class Gateways:
    """Two `kvgate serve` processes with the same config file."""

    def __init__(self, config: dict[str, Any], tmp: Path) -> None:
        path = tmp / "kvgate.yaml"
        path.write_text(yaml.safe_dump(config))
        self.ports = [free_port(), free_port()]
        self.logs = [tmp / f"kvgate-{i}.log" for i in range(len(self.ports))]  # stderr, for `why`
        self.procs = []
        for p, log in zip(self.ports, self.logs, strict=True):
            with log.open("wb") as err:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), "--port", str(p)],
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                ))  # fmt: skip
        self.clients = [httpx.AsyncClient(base_url=f"http://127.0.0.1:{p}", timeout=10) for p in self.ports]

    async def ready(self, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            for c, proc in zip(self.clients, self.procs, strict=True):
                while True:
                    assert proc.poll() is None, "kvgate exited during start-up\n" + self.why()
                    with contextlib.suppress(httpx.TransportError):
                        if (await c.get("/ready")).status_code == 200:
                            break
                    await asyncio.sleep(0.1)

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def why(self) -> str:
        """Each process's exit code (None: running) and the end of its stderr: the message of a
        failed `alive()`."""
        return "\n".join(
            f"gateway {i}: exit {p.poll()}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            for i, (p, log) in enumerate(zip(self.procs, self.logs, strict=True))
        )

    async def close(self) -> None:
        for c in self.clients:
            await c.aclose()
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@contextlib.asynccontextmanager
async def two_gateways(store: dict[str, Any], tmp: Path) -> AsyncIterator[Gateways]:
    async with SimFleet(replicas=2, profile="tiny") as fleet:
        cfg = merge(base_config([(fleet, MODEL, "r")]), {"tenants": [ACME], "state": store})
        gws = Gateways(cfg, tmp)
        try:
            await gws.ready()
            yield gws
        finally:
            await gws.close()


async def send(c: httpx.AsyncClient, n: int) -> list[int]:
    out = []
    for i in range(n):
        r = await c.post("/v1/chat/completions", json=chat(f"q{i}", max_tokens=2), headers=auth("acme"))
        out.append(r.status_code)
    return out


async def send_both(gws: Gateways, n_each: int) -> tuple[list[int], list[int]]:
    a, b = await asyncio.gather(send(gws.clients[0], n_each), send(gws.clients[1], n_each))
    return a, b


async def stores_up(gws: Gateways) -> bool:
    return all([await metric_value(c, "kvgate_state_store_up") == 1 for c in gws.clients])


async def wait_stores_up(gws: Gateways, timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not await stores_up(gws):  # noqa: ASYNC110  (polling other processes)
            await asyncio.sleep(0.1)


async def test_two_gateway_processes_enforce_one_limit_together(
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with two_gateways(state(redis_server.url, "open"), tmp_path) as gws:
        a, b = await send_both(gws, 15)
        assert a.count(200) + b.count(200) == BURST, (a, b)  # one bucket of 20, not 20 each
        assert a.count(200) > 0 and b.count(200) > 0
        assert set(a + b) == {200, 429}
        r = await gws.clients[1].post("/v1/chat/completions", json=chat("x"), headers=auth("acme"))
        assert r.status_code == 429 and r.headers["x-ratelimit-remaining-requests"] == "0"
        for c in gws.clients:  # both see the shared bucket
            status = (await c.get("/admin/tenants/acme", headers=ADMIN)).json()
            assert status["store"] == "redis" and status["buckets"]["requests"]["level"] < 1


async def test_fail_open_shares_the_limit_out_while_redis_is_down_and_shares_it_again_after(
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with two_gateways(state(redis_server.url, "open", gateways=2), tmp_path) as gws:
        a, b = await send_both(gws, 5)
        assert a + b == [200] * 10  # 10 of the shared 20 used
        redis_server.stop()
        a, b = await send_both(gws, 15)
        # each gateway falls back to local buckets holding half the limit, full at first use
        assert a.count(200) == BURST // 2 and b.count(200) == BURST // 2, (a, b)
        assert set(a + b) == {200, 429}  # no 5xx: fail-open keeps serving within its share
        assert gws.alive(), gws.why()
        assert await metric_value(gws.clients[0], "kvgate_state_store_up") == 0
        assert await metric_value(gws.clients[0], "kvgate_state_store_errors_total") >= 1
        redis_server.start()  # empty: a full shared bucket of 20
        await wait_stores_up(gws)
        # shared again: one gateway may use the whole bucket, and then the other gets nothing
        assert (await send(gws.clients[0], 20)) == [200] * BURST
        assert (await send(gws.clients[1], 3)) == [429] * 3
        assert gws.alive(), gws.why()


async def test_fail_closed_refuses_with_503_while_redis_is_down_then_recovers(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    cfg = {
        "tenants": [ACME, tenant("unlimited")],
        "state": state(redis_server.url, "closed", gateways=1, timeout_s=0.5),
    }
    async with tenancy_stack(cfg) as s:
        assert await send(s.client, 3) == [200] * 3
        redis_server.stop()
        r = await s.client.post("/v1/chat/completions", json=chat("x"), headers=auth("acme"))
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["type"] == "overloaded_error" and "limit store" in err["message"]
        assert int(r.headers["retry-after"]) >= 1
        # a tenant without limits needs no store and is still served
        r = await s.client.post("/v1/chat/completions", json=chat("y"), headers=auth("unlimited"))
        assert r.status_code == 200
        status = (await s.client.get("/admin/tenants/acme", headers=ADMIN)).json()
        assert status["buckets"] is None and status["store"] == "unavailable"
        redis_server.start()
        await wait_for(lambda: s.gateway.tenancy.limiter.store.up, timeout=15)
        statuses = await send(s.client, BURST + 2)
        assert statuses == [200] * BURST + [429, 429]  # a fresh Redis: the full bucket, then 429
        assert await metric_value(s.client, "kvgate_rejections_total", {"reason": "store_unavailable"}) == 1
