"""loadtests/ab_bench.py: the gateway config it runs is valid (three routes over the same two arms),
each phase's requests carry their conversation's session header, and the summary over seeds."""

from __future__ import annotations

import argparse

from gateway.config import parse_config
from gateway.config_check import check_semantics
from loadtests import ab_bench


def test_the_gateway_config_splits_two_adapters_three_ways() -> None:
    cfg = parse_config(ab_bench.gateway_config(["http://127.0.0.1:1", "http://127.0.0.1:2"]))
    check_semantics(cfg)
    routes = {r.name: r for r in cfg.routes}
    assert set(routes) == {"sticky", "random", "mirrored"}
    for r in routes.values():
        assert [(t.model, t.weight) for t in r.targets] == [(a, 50) for a in ab_bench.ARMS]
    assert routes["sticky"].sticky_by == ("header:x-session-id",) and routes["random"].sticky_by == ()
    mirror = routes["mirrored"].mirror
    assert mirror is not None and mirror.model == ab_bench.MIRROR and mirror.percent == 10


def test_each_request_carries_its_conversations_session_and_phases_differ() -> None:
    args = argparse.Namespace(conversations=3, turns=2, active=2, system_tokens=64)
    specs = ab_bench.workload("sticky", args, seed=1)
    assert len(specs) == 6 and all(s.body["model"] == "sticky" for s in specs)
    sessions = {s.headers["x-session-id"] for s in specs}
    assert sessions == {f"sticky-1-conv-{i}" for i in range(3)}
    other = ab_bench.workload("random", args, seed=1)
    assert other[0].body["messages"] != specs[0].body["messages"]  # fresh conversations per phase


def test_summary_takes_the_median_and_the_worst_of_each_figure() -> None:
    def phase(hit: float, p90: float, p99: float) -> dict[str, float]:
        return {"hit_rate": hit, "ttft_p90_s": p90, "ttft_p99_s": p99}

    seeds = [
        {"sticky": phase(0.8, 0.1, 0.3), "random": phase(0.5, 0.2, 0.4), "mirrored": phase(0.8, 0.1, 0.33),
         "mirror_p99_change": 0.1},
        {"sticky": phase(0.7, 0.3, 0.5), "random": phase(0.4, 0.4, 0.6), "mirrored": phase(0.7, 0.3, 0.5),
         "mirror_p99_change": 0.0},
        {"sticky": phase(0.9, 0.2, 0.4), "random": phase(0.6, 0.3, 0.5), "mirrored": phase(0.9, 0.2, 0.38),
         "mirror_p99_change": -0.05},
    ]  # fmt: skip
    s = ab_bench.summarize(seeds)
    assert s["sticky"]["hit_rate"] == {"median": 0.8, "worst": 0.7}  # worst: the lowest
    assert s["random"]["ttft_p90_s"] == {"median": 0.3, "worst": 0.4}  # worst: the highest
    assert s["mirror_p99_change"] == {"median": 0.0, "worst": 0.1}
    assert "| sticky | 80.0% (70.0%) | 200 (300) | 400 (500) |" in ab_bench.report(s)
    assert (
        ab_bench.summarize([{**seeds[0], "mirror_p99_change": None}])["mirror_p99_change"]["median"] is None
    )
