from __future__ import annotations

import random
from typing import Any

import pytest

from gateway.config import parse_config
from gateway.config_latency import profile_prior
from loadtests.des.fleet import FleetSpec, build_replicas
from loadtests.des.gateway_model import GatewayModel, RouteError, gateway_config
from loadtests.des.prompts import PromptTokenizer
from policies.prefix_index import capacity_blocks
from simulator.engine import EngineRequest

SPEC = FleetSpec(replicas=3, profile="tiny")
MODEL = SPEC.model_name


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def model(policy: str = "default", **overrides: Any) -> tuple[GatewayModel, Clock]:
    clock = Clock()
    gw = GatewayModel(gateway_config(None, SPEC.names, MODEL, policy=policy, **overrides), clock,
                      random.Random(0))
    for rep in build_replicas(SPEC):
        gw.serve_models(rep.index, MODEL, ())
        gw.scrape(rep.index, rep.engine.stats)
    return gw, clock


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "system", "content": "Shared rules. " * 200 + "Go."},
                                          {"role": "user", "content": text}], "max_tokens": 8, **extra}


def test_config_replaces_replicas_and_applies_overrides() -> None:
    base = parse_config({"scheduling": {"prefix_index": {"block_tokens": 32}}, "fleet": {"stale_after_s": 3}})
    cfg = gateway_config(base, ("r0", "r1"), "m", policy="round-robin", tokenizer="sim",
                         scrape_interval_s=0.05, seed=7)
    assert [r.display_name for r in cfg.replicas] == ["r0", "r1"] and {r.model for r in cfg.replicas} == {"m"}
    assert cfg.scheduling.profile == "round-robin" and cfg.scheduling.seed == 7
    assert cfg.scheduling.prefix_index.block_tokens == 32
    assert cfg.fleet.scrape_interval_s == 0.05 and cfg.fleet.stale_after_s == 3
    assert [(m.name, m.tokenizer) for m in cfg.models] == [("m", "sim")]


def test_the_latency_gate_stays_off_so_its_routing_filter_does_not_act() -> None:
    # Flow control is not modelled: the `latency-knee` filter must not act without the gate.
    base = parse_config({"flow_control": {"predicted_admission": True, "knee_factor": 2.0}})
    cfg = gateway_config(base, ("r0", "r1"), "m")
    assert not cfg.flow_control.predicted_admission and cfg.flow_control.knee_factor == 2.0
    assert not gateway_config(None, ("r0",), "m").flow_control.predicted_admission


def test_the_gate_stays_as_configured_when_flow_control_is_modelled() -> None:
    base = parse_config({"flow_control": {"predicted_admission": True, "knee_factor": 2.0}})
    cfg = gateway_config(base, ("r0", "r1"), "m", flow_control=True)
    assert cfg.flow_control.predicted_admission and cfg.flow_control.knee_factor == 2.0


def test_the_fleets_profile_is_the_pools_latency_prior_unless_the_config_gives_one() -> None:
    # As `kvgate bench` configures its live gateway: the latency model starts from the fleet's speed.
    cfg = gateway_config(None, ("r0",), "m", tokenizer="sim", latency_prior="tiny")
    (entry,) = [m for m in cfg.models if m.name == "m"]
    assert entry.tokenizer == "sim" and entry.latency_prior is not None
    assert entry.latency_prior.prior() == profile_prior("tiny", 1.0)
    own = {"models": [{"name": "m", "latency_prior": {"prefill_s_per_token": 1e-4}}]}
    kept = gateway_config(own, ("r0",), "m", latency_prior="tiny").models[0].latency_prior
    assert kept is not None and kept.profile is None and kept.prefill_s_per_token == 1e-4
    assert gateway_config(None, ("r0",), "m").models == ()  # nothing asked, nothing added


def test_byte_block_facts_are_the_routers_own() -> None:
    gw, _ = model()
    body = chat("What is a block?")
    info = gw.request_info("chat", body)
    facts = gw.router.prompt_facts("chat", body, MODEL, None)
    assert info.prefix_keys == facts.prefix_keys and not info.prompt_tokens_exact
    assert info.prompt_tokens == facts.prompt_tokens and info.max_tokens == 8


def test_token_block_facts_from_the_runs_ids_equal_the_sim_tokenizers() -> None:
    gw, _ = model(tokenizer="sim")
    body = chat("What is a block?")
    ids = PromptTokenizer().chat_ids(body["messages"])
    info = gw.request_info("chat", body, prompt_ids=ids)
    facts = gw.router.prompt_facts("chat", body, MODEL, None)  # the gateway's SimTokenizer path
    assert info.prefix_keys == facts.prefix_keys and info.prompt_tokens_exact
    assert info.prompt_tokens == len(ids) == facts.prompt_tokens


def test_output_cap_session_and_tenant() -> None:
    gw, _ = model()
    info = gw.request_info("chat", chat("x", max_completion_tokens=3), tenant="acme",
                           headers={"X-Session-Id": "conv-1"})
    assert (info.max_tokens, info.session_id, info.tenant) == (3, "conv-1", "acme")
    body = chat("x")
    del body["max_tokens"]
    assert gw.request_info("chat", body).max_tokens == 4096  # the tenant default cap


def test_unknown_model_is_a_404() -> None:
    gw, _ = model()
    with pytest.raises(RouteError) as err:
        gw.request_info("chat", {**chat("x"), "model": "nope"})
    assert err.value.status == 404


def test_the_first_scrape_sizes_each_replicas_prefix_index() -> None:
    gw, _ = model()
    blocks = build_replicas(SPEC)[0].engine.num_gpu_blocks
    assert gw.router.index.capacity("r1") == capacity_blocks(blocks, 16, gw.router.index_block_tokens)


def test_route_counts_in_flight_live_and_prefix_affinity_follows_the_dispatch() -> None:
    gw, clock = model()
    first = gw.route(gw.request_info("chat", chat("one")), clock.now)
    state = gw.fleet.snapshot().replicas[first.replica]
    assert state.in_flight == 1 and state.in_flight_tokens == first.tokens == first.info.reserved_tokens
    clock.now = 0.01  # no scrape since: only the gateway's own count moved
    second = gw.route(gw.request_info("chat", chat("two")), clock.now)
    assert second.replica == first.replica and second.matched_blocks > 0  # the shared system prompt
    gw.finished(first)
    gw.finished(second)
    assert gw.fleet.snapshot().replicas[first.replica].in_flight == 0


def test_scraped_gauges_change_only_when_scraped() -> None:
    gw, clock = model(policy="round-robin")
    reps = build_replicas(SPEC)
    rep = reps[0]
    rep.engine.add_request(EngineRequest("a", list(range(100)), 4), 0.0)
    rep.engine.step(0.0)
    rep.engine.add_request(EngineRequest("b", list(range(200, 300)), 4), 0.0)
    before = gw.fleet.snapshot().replicas[0]
    assert (before.running, before.waiting) == (0, 0)  # the engine moved, the gateway's picture did not
    clock.now = 0.2
    gw.scrape(0, rep.engine.stats)
    after = gw.fleet.snapshot().replicas[0]
    assert (after.running, after.waiting, after.scraped_at) == (1, 1, 0.2) and after.kv_usage > 0


def test_a_multi_turn_workload_reaches_the_session_map_only_with_its_header() -> None:
    from loadtests.workloads.multi_turn import MultiTurnWorkload

    def session_score(header: str | None) -> float:
        wl = MultiTurnWorkload(conversations=1, turns=2, system_prompt_tokens=40, user_tokens=12,
                               output_tokens=8, model=MODEL, session_header=header)  # fmt: skip
        gw, _ = model()
        first, second = (gw.request_info("chat", s.body, headers=s.headers) for s in wl.requests())
        assert first.session_id == second.session_id == (None if header is None else "conv-0")
        routed = gw.route(first, 0.0)
        gw.finished(routed)
        decision = gw.router.decide(second, gw.fleet.snapshot(), 0.0).decision
        winner = decision.ranked[0].name
        assert header is None or winner == gw.names[routed.replica]
        return decision.scores[winner]["session-affinity"]

    assert session_score("x-session-id") == 1.0
    assert session_score(None) == 0.0


def test_the_kv_ledger_follows_dispatch_and_end_as_on_the_live_path() -> None:
    gw, clock = model("predicted-latency")
    est = gw.router.latency
    routed = gw.route(gw.request_info("chat", chat("Ledger?")), clock.now)
    name = gw.names[routed.replica]
    assert routed.ticket is not None and routed.ticket.prompt_tokens == routed.info.prompt_tokens
    assert routed.ticket.output_tokens == 8 and est.kv_in_flight(name) == 1
    clock.now = 0.05
    gw.first_token(routed, clock.now)
    assert est.kv_in_flight(name) == 1
    gw.finished(routed, True, 0.01)
    assert est.kv_in_flight(name) == 0
