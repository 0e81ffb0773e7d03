from __future__ import annotations

import pytest

from loadtests.des.fleet import FleetSpec, build_replicas
from simulator.engine import EngineConfig, EngineRequest


def request(rid: str, n: int = 40, max_tokens: int = 3) -> EngineRequest:
    return EngineRequest(rid, list(range(1_000 * int(rid), 1_000 * int(rid) + n)), max_tokens)


def test_a_request_for_an_idle_replica_asks_for_a_step_and_later_ones_wait_for_the_boundary() -> None:
    (rep,) = build_replicas(FleetSpec(replicas=1, profile="tiny"))
    assert rep.submit(request("1"), 0.0)  # idle: the caller starts a step
    first = rep.start_step(0.0)
    assert first is not None and rep.busy and first.num_prefill_tokens == 40
    assert not rep.submit(request("2"), first.end / 2)  # mid-step: joins at the next boundary
    stats = rep.engine.stats
    assert (stats.num_running, stats.num_waiting) == (1, 0)  # /metrics does not see it yet
    second = rep.start_step(first.end)
    assert second is not None and second.num_prefill_tokens == 40 and second.num_decode_seqs == 1
    assert rep.routed == 2


def test_arrival_time_is_kept_when_the_request_joins_at_the_boundary() -> None:
    (rep,) = build_replicas(FleetSpec(replicas=1, profile="tiny"))
    rep.submit(request("1", max_tokens=1), 0.0)
    step = rep.start_step(0.0)
    assert step is not None
    rep.submit(request("2", max_tokens=1), 0.001)
    arrivals = {}
    while (step := rep.start_step(step.end)) is not None:
        arrivals.update({f.request_id: f.arrival for f in step.finished})
    assert arrivals == {"2": 0.001}


def test_the_replica_goes_idle_when_the_engine_has_nothing_to_run() -> None:
    (rep,) = build_replicas(FleetSpec(replicas=1, profile="tiny"))
    assert rep.start_step(0.0) is None and not rep.busy
    rep.submit(request("1", max_tokens=1), 0.0)
    step = rep.start_step(0.0)
    assert step is not None and [f.request_id for f in step.finished] == ["1"]
    assert rep.start_step(step.end) is None and not rep.busy


def test_abort_pending_or_running() -> None:
    (rep,) = build_replicas(FleetSpec(replicas=1, profile="tiny"))
    rep.submit(request("1", max_tokens=50), 0.0)
    step = rep.start_step(0.0)
    assert step is not None
    rep.submit(request("2"), 0.0)
    assert rep.abort("2", 0.0) and not rep.pending
    assert rep.abort("1", step.end) and not rep.engine.has_unfinished()
    assert not rep.abort("1", step.end)
    assert rep.engine.kv_cache.num_used_blocks == 0


def test_fleet_spec() -> None:
    spec = FleetSpec(replicas=3, profile="tiny", engine=EngineConfig(num_gpu_blocks=64))
    assert spec.names == ("r0", "r1", "r2") and spec.model_name == "tiny-llama"
    reps = build_replicas(spec)
    assert [r.engine.num_gpu_blocks for r in reps] == [64, 64, 64]
    assert len({id(r.engine) for r in reps}) == 3
    assert FleetSpec(replicas=1, model="served-name").model_name == "served-name"
    with pytest.raises(ValueError, match="replicas"):
        FleetSpec(replicas=0)
    with pytest.raises(ValueError, match="max_loras"):
        FleetSpec(replicas=1, adapters=("a",))
    with pytest.raises(ValueError, match="unknown profile"):
        FleetSpec(replicas=1, profile="nope")
