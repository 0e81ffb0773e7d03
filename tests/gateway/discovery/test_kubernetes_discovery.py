"""Kubernetes discovery end to end: kvgate watching a fake API server, in front of simulated replicas.

No cluster can run on these machines, so the API server is the hand-written `FakeKubeApi` (it speaks
the real list/watch protocol — resourceVersion, bookmarks, 410 Gone, dropped connections — and every
object it serves is validated against the Kubernetes schemas with kubernetes-validate). Everything
else is real: kvgate's lightkube-built client authenticates with a token from a kubeconfig file, and
the replicas are simulator processes on their own loopback IPs (127.0.0.x), all on one port, as pods
behind a Service are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.tenants import ANONYMOUS
from simulator.server.faults import FaultConfig
from tests.gateway.discovery.fake_kube_api import (
    PODS,
    SLICES,
    FakeKubeApi,
    endpoint,
    endpoint_slice,
    pod,
)
from tests.gateway.discovery.helpers import Kvgate, chat, kvgate, pods, until
from tests.gateway.stack import MODEL

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"


def k8s_config(api: FakeKubeApi, tmp_path: Path, port: int, **overrides: Any) -> dict[str, Any]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
                "users": [{"name": "kvgate", "user": {"token": api.token}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "kvgate"}}],
                "current-context": "fake",
            }
        )
    )
    source: dict[str, Any] = {
        "namespace": "inference",
        "service": "vllm",
        "port": port,
        "model": MODEL,
        "kubeconfig": str(kubeconfig),
        "resync_s": 30,  # long: the watch, not the periodic list, must carry these changes
        "watch_timeout_s": 60,
        "request_timeout_s": 2,
        "retry_s": 0.05,
    }
    stale = overrides.pop("stale_after_s", 61)
    source.update(overrides)
    return {"discovery": {"kubernetes": source, "stale_after_s": stale}}


def slice_of(port: int, *endpoints: dict[str, Any], name: str = "vllm-abcde") -> dict[str, Any]:
    return endpoint_slice(name, "vllm", list(endpoints), port)


async def served_by(kv: Kvgate, text: str) -> str:
    r = await kv.client.post("/v1/chat/completions", json=chat(text))
    assert r.status_code == 200, r.text
    return r.headers["x-kvgate-replica"]


def list_watch(kv: Kvgate) -> Any:
    return kv.gateway.discovery.sources["kubernetes"].list_watch


async def test_scale_up_and_down_and_a_pod_without_the_model_is_never_routed(tmp_path: Path) -> None:
    async with FakeKubeApi() as api, pods([A, B], spare=2) as p:
        api.put(SLICES, slice_of(p.port, endpoint("vllm-0", A), endpoint("vllm-1", B)))
        async with kvgate(k8s_config(api, tmp_path, p.port)) as kv:
            await until(lambda: kv.states() == {"vllm-0": "ready", "vllm-1": "ready"}, what="both ready")
            assert (await kv.client.get("/ready")).status_code == 200
            assert await served_by(kv, "hello") in ("vllm-0", "vllm-1")

            # Scale up: a new pod, and one whose server lists another model ("registered as unknown").
            await p.start(C)
            await p.start("127.0.0.5", model="some-other-model")
            api.put(SLICES, slice_of(p.port, endpoint("vllm-0", A), endpoint("vllm-1", B),
                                     endpoint("vllm-2", C), endpoint("vllm-3", "127.0.0.5")))  # fmt: skip
            await until(lambda: kv.states().get("vllm-2") == "ready", what="the new pod ready")
            assert kv.states()["vllm-3"] == "not_ready"  # its /v1/models does not list tiny-llama
            kv.gateway.fleet.drain("vllm-0")
            kv.gateway.fleet.drain("vllm-1")
            assert {await served_by(kv, f"new pod {i}") for i in range(3)} == {"vllm-2"}
            kv.gateway.fleet.undrain("vllm-0")
            kv.gateway.fleet.undrain("vllm-1")

            # Scale down to one pod: the others are forgotten, also by /ready.
            api.put(SLICES, slice_of(p.port, endpoint("vllm-2", C)))
            await until(lambda: set(kv.states()) == {"vllm-2"}, what="scaled down")
            body = (await kv.client.get("/ready")).json()
            assert [r["name"] for r in body["replicas"]] == ["vllm-2"]
            assert body["discovery"][0]["source"] == "kubernetes" and not body["discovery"][0]["stale"]
            assert {await served_by(kv, f"after {i}") for i in range(3)} == {"vllm-2"}
            assert list_watch(kv).relists["error"] == 0 and api.lists[SLICES] == 1  # the watch did it all


async def test_a_terminating_endpoint_gets_no_new_request_and_its_stream_finishes(tmp_path: Path) -> None:
    async with FakeKubeApi() as api, pods([A, B]) as p:
        api.put(SLICES, slice_of(p.port, endpoint("vllm-0", A), endpoint("vllm-1", B, ready=False)))
        async with kvgate(k8s_config(api, tmp_path, p.port)) as kv:
            await until(lambda: kv.states() == {"vllm-0": "ready", "vllm-1": "not_ready"})
            long_answer = chat("a long answer", max_tokens=12, stream=True)
            async with kv.client.stream("POST", "/v1/chat/completions", json=long_answer) as resp:
                assert resp.headers["x-kvgate-replica"] == "vllm-0"
                chunks = resp.aiter_bytes()
                first = await anext(chunks)
                api.put(
                    SLICES, slice_of(p.port, endpoint("vllm-0", A, terminating=True), endpoint("vllm-1", B))
                )
                await until(lambda: kv.states() == {"vllm-0": "terminating", "vllm-1": "ready"})
                assert {await served_by(kv, f"meanwhile {i}") for i in range(3)} == {"vllm-1"}
                body = first + b"".join([c async for c in chunks])
            assert resp.status_code == 200 and body.rstrip().endswith(b"data: [DONE]")
            assert b"error" not in body


async def test_a_not_ready_blip_keeps_the_cache_picture_and_leaving_forgets_it(tmp_path: Path) -> None:
    async with FakeKubeApi() as api, pods([A]) as p:
        api.put(SLICES, slice_of(p.port, endpoint("vllm-0", A)))
        async with kvgate(k8s_config(api, tmp_path, p.port)) as kv:
            await until(lambda: kv.states() == {"vllm-0": "ready"})
            await served_by(kv, "a shared system prompt " * 60)
            index = kv.gateway.router.index
            held = index.replica_sizes()["vllm-0"]
            assert held > 0

            api.put(SLICES, slice_of(p.port, endpoint("vllm-0", A, ready=False)))
            await until(lambda: kv.states() == {"vllm-0": "not_ready"})
            assert index.replica_sizes()["vllm-0"] == held  # kept through the blip
            r = await kv.client.post("/v1/chat/completions", json=chat("while not ready"))
            assert r.status_code == 503  # not selectable meanwhile
            ready = await kv.client.get("/ready")
            assert ready.status_code == 503 and ready.json()["replicas"][0]["state"] == "not_ready"

            api.put(SLICES, slice_of(p.port, endpoint("vllm-0", A)))
            await until(lambda: kv.states() == {"vllm-0": "ready"})
            assert index.replica_sizes()["vllm-0"] == held

            api.delete(SLICES, "vllm-abcde")
            await until(lambda: kv.states() == {})
            assert "vllm-0" not in index.replica_sizes()  # gone: forgotten


async def test_a_missed_delete_is_found_by_the_periodic_relist(tmp_path: Path) -> None:
    async with FakeKubeApi() as api, pods([A, B]) as p:
        api.put(SLICES, slice_of(p.port, endpoint("vllm-0", A), name="vllm-aaaaa"))
        api.put(SLICES, slice_of(p.port, endpoint("vllm-1", B), name="vllm-bbbbb"))
        config = k8s_config(api, tmp_path, p.port, resync_s=1.0, stale_after_s=3.0)
        async with kvgate(config) as kv:
            await until(lambda: kv.states() == {"vllm-0": "ready", "vllm-1": "ready"})
            lists = api.lists[SLICES]
            api.delete(SLICES, "vllm-bbbbb", silently=True)  # the watch never hears of it
            api.bookmark()  # the watch is alive and up to date as far as it knows
            await until(lambda: list_watch(kv).relists["resync"] == 0 and api.open_watches(SLICES) == 1)
            assert "vllm-1" in kv.states()
            await until(lambda: "vllm-1" not in kv.states(), timeout=5, what="the re-list")
            assert api.lists[SLICES] > lists and list_watch(kv).relists["resync"] >= 1
            assert (await kv.client.get("/ready")).status_code == 200


@pytest.mark.parametrize("how", ["error_event", "http_status"])
async def test_410_gone_relists_and_finds_what_changed_meanwhile(tmp_path: Path, how: str) -> None:
    async with FakeKubeApi() as api, pods([A, B]) as p:
        api.put(SLICES, slice_of(p.port, endpoint("vllm-0", A), endpoint("vllm-1", B)))
        async with kvgate(k8s_config(api, tmp_path, p.port)) as kv:
            await until(lambda: kv.states() == {"vllm-0": "ready", "vllm-1": "ready"})
            await until(lambda: api.open_watches(SLICES) == 1)
            lists = api.lists[SLICES]
            api.delete(SLICES, "vllm-abcde", silently=True)
            api.put(SLICES, slice_of(p.port, endpoint("vllm-1", B), name="vllm-fghij"))
            if how == "error_event":
                # The open watch's version is compacted away: ERROR {Status 410} and the end.
                api.expire_watches()
                reason = "expired"
            else:
                # The watch request itself is refused with HTTP 410 (after a dropped connection).
                api.gone_as_http = True
                api.expire_next_watch = True
                await api.drop_watches()
                reason = "gone"
            await until(lambda: set(kv.states()) == {"vllm-1"}, what="the re-list after 410")
            await until(lambda: list_watch(kv).relists[reason] >= 1 or list_watch(kv).relists["error"] >= 1)
            assert api.lists[SLICES] > lists


async def test_a_dropped_watch_connection_relists(tmp_path: Path) -> None:
    async with FakeKubeApi() as api, pods([A, B]) as p:
        api.put(SLICES, slice_of(p.port, endpoint("vllm-0", A)))
        async with kvgate(k8s_config(api, tmp_path, p.port)) as kv:
            await until(lambda: kv.states() == {"vllm-0": "ready"})
            await until(lambda: api.open_watches(SLICES) == 1)
            lists = api.lists[SLICES]
            await api.drop_watches()
            api.put(SLICES, slice_of(p.port, endpoint("vllm-1", B), name="vllm-other"))
            await until(lambda: kv.states() == {"vllm-0": "ready", "vllm-1": "ready"})
            assert api.lists[SLICES] > lists  # it re-listed on reconnect, not resumed the watch


async def test_pods_by_label_selector(tmp_path: Path) -> None:
    labels = {"app": "vllm"}
    async with FakeKubeApi() as api, pods([A, B, C]) as p:
        api.put(PODS, pod("vllm-0", A, labels))
        api.put(PODS, pod("vllm-1", B, labels, ready=False))
        api.put(PODS, pod("vllm-2", C, labels, deleting=True))
        api.put(PODS, pod("vllm-3", None, labels, phase="Pending", ready=False))  # no IP yet
        api.put(PODS, pod("other", "127.0.0.9", {"app": "redis"}))
        config = k8s_config(api, tmp_path, p.port, service=None, selector="app=vllm", model=None)
        async with kvgate(config) as kv:
            await until(
                lambda: kv.states() == {"vllm-0": "ready", "vllm-1": "not_ready", "vllm-2": "terminating"}
            )
            # No model in the config: the pool came from the pod's own /v1/models.
            assert kv.gateway.fleet.snapshot().by_name("vllm-0").pool == MODEL
            api.put(PODS, pod("vllm-1", B, labels))
            await until(lambda: kv.states()["vllm-1"] == "ready")
            api.delete(PODS, "vllm-2")
            await until(lambda: "vllm-2" not in kv.states())
            assert api.lists[PODS] == 1


async def test_discovery_goes_stale_when_the_api_server_is_gone_but_keeps_its_last_list(
    tmp_path: Path,
) -> None:
    async with pods([A]) as p:
        api = FakeKubeApi()
        await api.__aenter__()
        api.put(SLICES, slice_of(p.port, endpoint("vllm-0", A)))
        config = k8s_config(api, tmp_path, p.port, resync_s=0.5, stale_after_s=1.5)
        async with kvgate(config) as kv:
            await until(lambda: kv.states() == {"vllm-0": "ready"})
            assert (await kv.client.get("/ready")).status_code == 200
            await api.__aexit__(None, None, None)
            await until(lambda: kv.gateway.discovery.stale_sources() == ["kubernetes"], timeout=5)
            ready = await kv.client.get("/ready")
            assert ready.status_code == 503 and ready.json()["discovery"][0]["stale"]
            assert kv.states() == {"vllm-0": "ready"}  # the last good list stays in force
            assert await served_by(kv, "still served") == "vllm-0"
            text = (await kv.client.get("/metrics")).text
            assert 'kvgate_discovery_errors_total{source="kubernetes"}' in text
            assert 'kvgate_replica_state{replica="vllm-0",state="ready"} 1.0' in text


async def test_a_wrong_token_is_refused_and_nothing_is_discovered(tmp_path: Path) -> None:
    async with FakeKubeApi() as api, pods([A]) as p:
        api.put(SLICES, slice_of(p.port, endpoint("vllm-0", A)))
        config = k8s_config(api, tmp_path, p.port)
        api.token = "another-token"
        async with kvgate(config) as kv:
            await until(lambda: api.unauthorized >= 1)
            assert kv.states() == {}
            assert (await kv.client.get("/ready")).status_code == 503


async def test_a_request_in_flight_to_a_replica_that_leaves_settles(tmp_path: Path) -> None:
    async with FakeKubeApi() as api, pods([B]) as p:
        # vllm-0 decodes slowly (about 0.3 s a token): its 10-token stream is surely still running
        # when the watch tells kvgate it left, however busy the machine is.
        await p.start(A, faults=FaultConfig(slowdown=150))
        api.put(SLICES, slice_of(p.port, endpoint("vllm-0", A), endpoint("vllm-1", B, ready=False)))
        async with kvgate(k8s_config(api, tmp_path, p.port)) as kv:
            await until(lambda: kv.states() == {"vllm-0": "ready", "vllm-1": "not_ready"})
            fleet = kv.gateway.fleet
            admission = kv.gateway.tenancy.admission
            streaming = chat("stream on", max_tokens=10, stream=True)
            async with kv.client.stream("POST", "/v1/chat/completions", json=streaming) as resp:
                chunks = resp.aiter_bytes()
                first = await anext(chunks)
                assert fleet.snapshot().by_name("vllm-0").in_flight == 1
                api.put(SLICES, slice_of(p.port, endpoint("vllm-1", B)))  # vllm-0 left the Service
                await until(lambda: kv.states() == {"vllm-0": "terminating", "vllm-1": "ready"})
                body = first + b"".join([c async for c in chunks])
            assert body.rstrip().endswith(b"data: [DONE]") and b"error" not in body
            await until(lambda: "vllm-0" not in kv.states(), what="forgotten once its stream ended")
            assert fleet.snapshot().by_name("vllm-1").in_flight == 0
            assert admission.in_flight_of(ANONYMOUS) == 0 and admission.depth == 0
            assert await served_by(kv, "next") == "vllm-1"


async def test_a_request_waiting_for_its_first_byte_is_rerouted_when_its_replica_leaves(
    tmp_path: Path,
) -> None:
    async with FakeKubeApi() as api, pods([A]) as p:
        await p.start(B, faults=FaultConfig(hang_after_chunks=0))  # takes requests, never answers
        api.put(SLICES, slice_of(p.port, endpoint("vllm-0", A), endpoint("vllm-1", B)))
        async with kvgate(k8s_config(api, tmp_path, p.port)) as kv:
            await until(lambda: kv.states() == {"vllm-0": "ready", "vllm-1": "ready"})
            fleet = kv.gateway.fleet
            fleet.drain("vllm-0")  # so the request goes to the hanging replica

            async def ask() -> Any:
                return await kv.client.post("/v1/chat/completions", json=chat("where to?"))

            import asyncio

            request = asyncio.create_task(ask())
            await until(lambda: fleet.snapshot().by_name("vllm-1").in_flight == 1)
            fleet.undrain("vllm-0")
            api.put(SLICES, slice_of(p.port, endpoint("vllm-0", A)))  # vllm-1 leaves
            r = await asyncio.wait_for(request, 5)  # well before the 10 s first-byte timeout
            assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "vllm-0"
            await until(lambda: kv.states() == {"vllm-0": "ready"})
            assert fleet.snapshot().by_name("vllm-0").in_flight == 0
