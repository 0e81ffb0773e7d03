"""Hot reload over real loopback HTTP (issue #14): a reload through the admin API changes a tenant's
limit and a profile weight while a stream started before it runs to its end untouched; a change to a
restart-only setting is refused by name and changes nothing; a broken or invalid file keeps the last
good config, logged and counted; buckets, the prefix index and replica state survive; the file watch
follows in-place edits and ConfigMap-style symlink swaps, and counts a broken file once."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.gateway.reload_stack import ADMIN, reload_stack
from tests.gateway.stack import MODEL, chat, merge, metric_value, wait_for
from tests.gateway.tenancy_stack import auth, tenancy_stack, tenant

UNSET = "KVGATE_TEST_UNSET_REPLICA_KEY"
MEMBERSHIP_FILTERS = [{"type": t} for t in ("in-service", "healthy", "serves-model", "serves-adapter")]


def lean(queue_weight: float) -> dict[str, Any]:
    """A profile with one scorer, so `x-kvgate-route`'s total is its weight times its score."""
    return {"filters": MEMBERSHIP_FILTERS, "scorers": [{"type": "queue-depth", "weight": queue_weight}]}


def route_weight(r: httpx.Response) -> float:
    """The queue-depth weight this answer was routed with: total / score from x-kvgate-route."""
    parts = dict(p.split("=", 1) for p in r.headers["x-kvgate-route"].split(";"))
    score, total = float(parts["queue-depth"]), float(parts["total"])
    assert score > 0, parts
    return round(total / score, 2)


async def post(rs: Any, text: str, tenant_name: str = "acme", **kw: Any) -> httpx.Response:
    return await rs.client.post(
        "/v1/chat/completions", json=chat(text, max_tokens=2, **kw), headers=auth(tenant_name)
    )


async def test_a_reload_changes_a_limit_and_a_profile_weight_while_a_stream_runs(tmp_path: Path) -> None:
    def config(rpm: int, weight: float) -> dict[str, Any]:
        return {
            "tenants": [tenant("acme", limits={"rpm": rpm, "rpm_burst": 3})],
            "scheduling": {"profile": "lean", "profiles": {"lean": lean(weight)}},
        }

    # ~100 ms a token: the 60-token stream runs for ~6 s, across the reload.
    async with reload_stack(tmp_path, config(rpm=1, weight=1), time_scale=50) as rs:
        body = chat(
            "tell me a long story", max_tokens=60, stream=True, stream_options={"include_usage": True}
        )
        async with rs.client.stream("POST", "/v1/chat/completions", json=body, headers=auth("acme")) as s:
            assert s.status_code == 200
            lines = s.aiter_lines()
            events = [await anext(lines)]  # the stream is under way
            r = await post(rs, "one")
            assert r.status_code == 200 and route_weight(r) == 1
            assert (await post(rs, "two")).status_code == 200
            refused = await post(rs, "three")  # the stream took the first of 3: the bucket is empty
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 30

            rs.write(config(rpm=6000, weight=3))
            r = await rs.reload()
            assert r.status_code == 200, r.text
            got = r.json()
            assert got["reloaded"] is True and got["generation"] == 2
            assert "tenants" in got["message"] and "scheduling.profiles" in got["message"]
            assert rs.gateway.drain.in_flight == 1  # the stream, still running across the reload

            for _ in range(50):  # 100 requests a second refill it now: the refused request passes
                r = await post(rs, "three")
                if r.status_code == 200:
                    break
                assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert r.status_code == 200 and r.headers["x-ratelimit-limit-requests"] == "3"
            assert route_weight(r) == 3
            assert s.status_code == 200
            events += [line async for line in lines]
        data = [e.removeprefix("data: ") for e in events if e.startswith("data: ")]
        assert data[-1] == "[DONE]"
        chunks = [orjson.loads(d) for d in data[:-1]]
        assert not any("error" in c for c in chunks)
        assert chunks[-1]["usage"]["completion_tokens"] == 60
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text  # the whole answer, untouched

        status = await rs.config_status()
        assert status["generation"] == 2 and status["hash"] == got["hash"]
        assert status["reloads"] == {"ok": 1, "invalid": 0, "refused": 0}
        assert status["last_error"] is None and status["last_reload"]["trigger"] == "admin"
        c = rs.client
        assert await metric_value(c, "kvgate_config_generation") == 2
        assert await metric_value(c, "kvgate_config_info", {"hash": got["hash"]}) == 1
        assert await metric_value(c, "kvgate_config_reloads_total", {"result": "ok"}) == 1


async def test_a_restart_only_change_is_refused_by_name_and_nothing_changes(tmp_path: Path) -> None:
    v1 = {"tenants": [tenant("acme", limits={"rpm": 1, "rpm_burst": 1})]}
    async with reload_stack(tmp_path, v1) as rs:
        assert (await post(rs, "a")).status_code == 200
        assert (await post(rs, "b")).status_code == 429
        before = await rs.config_status()
        rs.write(
            {
                "tenants": [tenant("acme", limits={"rpm": 6000})],  # hot, but in the same refused file
                "server": {"port": 9999},
                "state": {"store": "redis://127.0.0.1:1/0"},
            }
        )
        r = await rs.reload()
        assert r.status_code == 422, r.text
        err = r.json()
        assert err["error"]["code"] == "restart_required" and err["reloaded"] is False
        message = err["error"]["message"]
        assert "server.port (the listen address)" in message and "state.store" in message
        assert "nothing was changed" in message and "tenants" not in message
        assert err["generation"] == 1 and err["hash"] == before["hash"]
        assert (await post(rs, "c")).status_code == 429  # the limit in the refused file is not in force
        after = await rs.config_status()
        assert after["generation"] == 1 and after["hash"] == before["hash"]
        assert after["last_error"]["result"] == "refused" and after["last_error"]["message"] == message
        assert await metric_value(rs.client, "kvgate_config_reloads_total", {"result": "refused"}) == 1


async def test_a_broken_or_invalid_file_keeps_the_last_good_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(UNSET, raising=False)
    v1 = {"tenants": [tenant("acme", limits={"rpm": 1, "rpm_burst": 1})]}
    async with reload_stack(tmp_path, v1) as rs:
        bad = [
            ("tenants: [{name: acme\n", "not valid YAML"),
            ("scheduling: {profile: nope}\n", "scheduling.profile: no profile named 'nope'"),
            ("tenants: [{name: acme, limits: {rpm: -1}}]\n", "tenants.0.limits.rpm"),
            # A valid file whose credential cannot be read: refused by its component's prepare.
            (
                yaml.safe_dump(merge(rs.base, {**v1, "models": [{"name": MODEL, "api_key_env": UNSET}]})),
                f"models[0].api_key_env: the environment variable {UNSET} is unset or empty",
            ),
        ]
        good = await rs.config_status()
        for n, (text, reason) in enumerate(bad, start=1):
            rs.write_text(text)
            with caplog.at_level(logging.ERROR, logger="gateway.reload"):
                r = await rs.reload()
            assert r.status_code == 422 and r.json()["error"]["code"] == "config_invalid", r.text
            assert reason in r.json()["error"]["message"]
            assert "generation 1" in caplog.text and "stays in force" in caplog.text and reason in caplog.text
            caplog.clear()
            status = await rs.config_status()
            assert status["generation"] == 1 and status["hash"] == good["hash"]
            assert status["reloads"]["invalid"] == n and reason in status["last_error"]["message"]
            assert await metric_value(rs.client, "kvgate_config_reloads_total", {"result": "invalid"}) == n
        # Requests go on under the last good config: the tenant and its limit.
        assert (await post(rs, "a")).status_code == 200
        assert (await post(rs, "b")).status_code == 429
        rs.write({"tenants": [tenant("acme", limits={"rpm": 6000})]})  # fixed
        r = await rs.reload()
        assert r.status_code == 200 and r.json()["generation"] == 2
        status = await rs.config_status()
        assert status["last_error"]["result"] == "invalid"  # kept for the record


async def test_a_reload_adds_and_removes_static_replicas(tmp_path: Path) -> None:
    async with reload_stack(tmp_path, {}, replicas=3) as rs:
        everyone = rs.base["replicas"]
        rs.write({"replicas": everyone[:2]})
        assert (await rs.reload()).status_code == 200
        await wait_for(lambda: [r.name for r in rs.gateway.fleet.snapshot().replicas] == ["r0", "r1"])
        seen = {(await post(rs, f"q{i}", tenant_name="none")).headers["x-kvgate-replica"] for i in range(6)}
        assert seen <= {"r0", "r1"}
        rs.write({"replicas": everyone})
        assert (await rs.reload()).status_code == 200
        await wait_for(
            lambda: any(r.name == "r2" and r.scraped_at for r in rs.gateway.fleet.snapshot().replicas)
        )
        await rs.client.post("/admin/replicas/r0/drain", headers=ADMIN)
        await rs.client.post("/admin/replicas/r1/drain", headers=ADMIN)
        r = await post(rs, "only r2 is in service", tenant_name="none")
        assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "r2"


async def test_buckets_the_prefix_index_and_replica_state_survive_a_reload(tmp_path: Path) -> None:
    v1 = {"tenants": [tenant("acme", limits={"rpm": 6, "rpm_burst": 6})]}  # refills 0.1 a second
    prompt = "You are a careful assistant. " * 120  # a few index blocks of shared prefix
    async with reload_stack(tmp_path, v1, replicas=3) as rs:
        c = rs.client
        assert (await c.post("/admin/replicas/r2/drain", headers=ADMIN)).json()["drained"] is True
        r = await post(rs, prompt + "first")
        assert r.status_code == 200
        home = r.headers["x-kvgate-replica"]
        keys = await metric_value(c, "kvgate_prefix_index_keys", {"replica": home})
        assert keys > 0
        level = (await c.get("/admin/tenants/acme", headers=ADMIN)).json()["buckets"]["requests"]["level"]

        rs.write({"tenants": [tenant("acme", limits={"rpm": 6, "rpm_burst": 8}, weight=2.0)]})
        assert (await rs.reload()).status_code == 200
        after = (await c.get("/admin/tenants/acme", headers=ADMIN)).json()
        assert after["weight"] == 2.0 and after["buckets"]["requests"]["capacity"] == 8
        # The same bucket under its new limit, not a fresh one (full, at 8): only refill since.
        assert level <= after["buckets"]["requests"]["level"] < level + 0.2
        assert await metric_value(c, "kvgate_prefix_index_keys", {"replica": home}) == keys
        replicas = {x["name"]: x for x in (await c.get("/admin/replicas", headers=ADMIN)).json()["data"]}
        assert replicas["r2"]["drained"] is True and all(x["scraped"] for x in replicas.values())
        r = await post(rs, prompt + "second")
        assert r.status_code == 200 and r.headers["x-kvgate-replica"] == home


async def test_the_watch_follows_edits_and_symlink_swaps_and_counts_a_broken_file_once(
    tmp_path: Path,
) -> None:
    def config(rpm: int) -> dict[str, Any]:
        return {
            "server": {"watch_config": True, "watch_config_interval_s": 0.05},
            "tenants": [tenant("acme", limits={"rpm": rpm})],
        }

    async with reload_stack(tmp_path, config(1), symlinked=True) as rs:
        reloader = rs.gateway.reloader
        rs.write(config(2))  # in place, through the link
        await wait_for(lambda: reloader.current.generation == 2)
        assert rs.gateway.tenancy.registry.get("acme").rpm == 2
        rs.write(config(3), swap=True)  # a new file behind the link, as a ConfigMap update does
        await wait_for(lambda: reloader.current.generation == 3)
        assert rs.gateway.tenancy.registry.get("acme").rpm == 3
        assert reloader.last.trigger == "watch"

        rs.write_text("tenants: [", swap=True)
        await wait_for(lambda: reloader.last_error is not None)
        watch = rs.gateway._watch
        looks = watch.looks
        await wait_for(lambda: watch.looks >= looks + 5)
        status = await rs.config_status()
        assert status["reloads"] == {"ok": 2, "invalid": 1, "refused": 0}  # once, not once per look
        assert status["generation"] == 3 and status["watch"] is True

        rs.write({**config(4), "server": {"watch_config": False}})  # the watch turns itself off
        await wait_for(lambda: reloader.current.generation == 4)
        rs.write(config(5))
        looks = watch.looks
        r = await rs.reload()  # SIGHUP and the admin API still reload
        assert r.json()["generation"] == 5 and watch.looks == looks


async def test_without_a_config_file_there_is_nothing_to_reload() -> None:
    async with tenancy_stack({}) as s:  # built from a dict, as tests and embedders do
        r = await s.client.post("/admin/reload", headers=ADMIN)
        assert r.status_code == 409 and r.json()["error"]["code"] == "no_config_file"
        status = (await s.client.get("/admin/config", headers=ADMIN)).json()
        assert status["generation"] == 1 and status["file"] is None and status["watch"] is False
        assert status["reloads"] == {"ok": 0, "invalid": 0, "refused": 0}
        assert (await s.client.post("/admin/reload")).status_code == 401  # the admin guard
