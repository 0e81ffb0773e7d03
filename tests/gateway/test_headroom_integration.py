"""Goodput headroom over real loopback HTTP to the simulator: /metrics and GET /admin/pools carry
each pool's headroom, and it falls as the load on the fleet rises (ordering, not timings)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.auth_keys import hash_key
from tests.gateway.stack import MODEL, Stack, chat, metric_value, stack, wait_for

ADMIN = "sk-admin-headroom"
CONFIG = {
    "auth": {"admin_keys": [hash_key(ADMIN)]},
    "models": [{"name": MODEL, "latency_prior": {"profile": "tiny", "time_scale": 4.0}}],
    "headroom": {"ttft_slo_s": 0.5, "tpot_slo_s": 0.05},
}
PROMPT = "Draft the release notes for the storage service, section by section. " * 20


async def readings(s: Stack) -> tuple[float, float, float, dict[str, Any]]:
    rps = await metric_value(s.client, "kvgate_pool_goodput_headroom_requests_per_second", {"pool": MODEL})
    name = "kvgate_pool_goodput_headroom_tokens_per_second"
    prompt = await metric_value(s.client, name, {"pool": MODEL, "kind": "prompt"})
    output = await metric_value(s.client, name, {"pool": MODEL, "kind": "output"})
    ratio = await metric_value(s.client, "kvgate_pool_goodput_headroom_ratio", {"pool": MODEL})
    assert ratio <= 1.0
    r = await s.client.get("/admin/pools", headers={"authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200
    (pool,) = r.json()["data"]
    return rps, prompt, output, pool


async def test_headroom_is_exported_and_falls_as_load_rises() -> None:
    async with stack(replicas=2, time_scale=4.0, config=CONFIG) as s:
        assert (await s.client.get("/admin/pools")).status_code == 401  # an admin route like the others
        default = (await readings(s))[3]
        assert default["mix"]["samples"] == 0 and default["load_requests_per_second"] == 0

        # Streamed answers first, two at a time: every replica's model is calibrated from a few TTFTs and
        # TPOTs (its capacity moves most over the first observations), and the pool's mix is what was
        # observed, not the default.
        async def warm(i: int) -> None:
            body = chat(f"{PROMPT} warm {i}", max_tokens=16, stream=True)
            async with s.client.stream("POST", "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    pass

        for i in range(0, 12, 2):
            await asyncio.gather(warm(i), warm(i + 1))
        await wait_for(lambda: s.gateway.headroom.mix_samples(MODEL) == 12)
        # The replicas' scrapes show them idle again (a scrape from before the answers ended would
        # still count them busy).
        await wait_for(lambda: all(r.running + r.waiting == 0 for r in s.gateway.fleet.snapshot().replicas))

        idle_rps, idle_prompt, idle_output, idle = await readings(s)
        assert idle["pool"] == MODEL and idle["slo"] == {"ttft_s": 0.5, "tpot_s": 0.05}
        assert idle_rps > 0 and idle_prompt > 0 and idle_output > 0
        assert idle["goodput_headroom"]["requests_per_second"] > 0
        assert {r["name"] for r in idle["replicas"]} == {"r0", "r1"}
        assert idle["load_requests_per_second"] == 0
        assert idle["mix"]["output_tokens"] < default["mix"]["output_tokens"]

        release = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []

        async def one(i: int) -> None:
            body = chat(f"{PROMPT} stream {i}", max_tokens=2000, stream=True)
            async with s.client.stream("POST", "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    if release.is_set():
                        break

        async def load(n: int) -> tuple[float, dict[str, Any]]:
            tasks.extend(asyncio.create_task(one(len(tasks) + i)) for i in range(n))
            await wait_for(
                lambda: sum(r.in_flight for r in s.gateway.fleet.snapshot().replicas) == len(tasks)
            )
            rps, _, _, pool = await readings(s)
            return rps, pool

        try:
            light_rps, light = await load(4)
            heavy_rps, heavy = await load(28)
        finally:
            release.set()
            await asyncio.gather(*tasks, return_exceptions=True)

        # Each reading's headroom is its capacity less its load. Headroom in requests/s is not compared
        # across readings: the models keep calibrating from the streams in between, so a capacity read
        # later may be larger (on a loaded CI machine the warm-up's TTFTs were slow and the idle reading
        # was below the light one); the ratio, headroom / capacity of one reading, is.
        assert idle_rps > 0 and light_rps >= 0 and heavy_rps >= 0
        for pool in (light, heavy):
            h = pool["goodput_headroom"]["requests_per_second"]
            assert h < pool["capacity_requests_per_second"]
        ratios = [p["goodput_headroom"]["ratio"] for p in (idle, light, heavy)]
        assert ratios[0] == 1.0 and ratios[0] > ratios[1] > ratios[2]
        assert 0 < light["load_requests_per_second"] < heavy["load_requests_per_second"]
        assert light["mix"]["samples"] >= 12
        assert sum(r["busy"] for r in heavy["replicas"]) >= 32
        for pool in (light, heavy):
            h = pool["goodput_headroom"]
            assert h["prompt_tokens_per_second"] == h["requests_per_second"] * pool["mix"]["prompt_tokens"]


async def test_requests_queued_at_admission_count_against_the_headroom() -> None:
    # One slot per replica: the third and later streams wait at kvgate, not on the replicas.
    config = {**CONFIG, "flow_control": {"saturation": {"max_in_flight_per_replica": 1}}}
    async with stack(replicas=2, time_scale=4.0, config=config) as s:
        release = asyncio.Event()

        async def one(i: int) -> None:
            body = chat(f"{PROMPT} queued {i}", max_tokens=2000, stream=True)
            async with s.client.stream("POST", "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    if release.is_set():
                        break

        tasks = [asyncio.create_task(one(i)) for i in range(6)]
        try:
            admission = s.gateway.tenancy.admission
            await wait_for(lambda: admission.depth_in(MODEL) == 4)
            (pool,) = (
                await s.client.get("/admin/pools", headers={"authorization": f"Bearer {ADMIN}"})
            ).json()["data"]
            assert pool["backlog_requests_per_second"] == 4 / 0.5  # 4 queued, to start within 0.5 s
            h = pool["goodput_headroom"]["requests_per_second"]
            assert h == pytest.approx(
                pool["capacity_requests_per_second"] - pool["load_requests_per_second"] - 8.0
            )
        finally:
            release.set()
            await asyncio.gather(*tasks, return_exceptions=True)
