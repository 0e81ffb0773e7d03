"""Scheduling through the engine: limits per step, chunked prefill, preemption, LoRA, priority."""

from __future__ import annotations

import itertools

from simulator.engine import Engine, EngineConfig, StepResult
from simulator.profiles import get_profile
from tests.simulator.engine_run import distinct_prompt, request, run

TINY = get_profile("tiny")


def test_max_num_seqs_and_token_budget_hold_every_step() -> None:
    engine = Engine(TINY, EngineConfig(max_num_seqs=4, max_num_batched_tokens=256))
    arrivals = [
        (0.0005 * i, request(f"r{i}", distinct_prompt(i, 90 + 40 * i), max_tokens=15)) for i in range(20)
    ]
    r = run(engine, arrivals=arrivals)
    assert len(r.finished) == 20
    for step, stats in zip(r.steps, r.stats_after, strict=True):
        assert step.num_prefill_tokens + step.num_decode_seqs <= 256
        assert len({t.request_id for t in step.tokens}) <= 4
        assert stats.num_running <= 4
    assert max(s.num_running for s in r.stats_after) == 4
    assert max(s.num_waiting for s in r.stats_after) > 0
    assert max(s.num_prefill_tokens + s.num_decode_seqs for s in r.steps) == 256


def test_chunked_prefill_splits_a_long_prompt() -> None:
    engine = Engine(TINY, EngineConfig(max_num_batched_tokens=256))
    r = run(engine, arrivals=[(0.0, request("long", distinct_prompt(1, 1000), max_tokens=3))])
    assert [s.num_prefill_tokens for s in r.steps[:4]] == [256, 256, 256, 232]
    assert [len(s.tokens) for s in r.steps] == [0, 0, 0, 1, 1, 1]
    assert r.finished["long"].computed_prompt_tokens == 1000


def test_decodes_go_first_and_prefill_takes_the_rest_of_the_budget() -> None:
    engine = Engine(TINY, EngineConfig(max_num_batched_tokens=100))
    engine.add_request(request("short", [1, 2, 3], max_tokens=50), 0.0)
    now = engine.step(0.0).end
    engine.add_request(request("long", distinct_prompt(2, 500), max_tokens=2), now)
    step = engine.step(now)
    assert (step.num_decode_seqs, step.num_prefill_tokens) == (1, 99)


def test_chunked_prefill_costs_about_the_same_as_one_big_step() -> None:
    prompt = distinct_prompt(3, 2048)
    whole = run(Engine(TINY), arrivals=[(0.0, request("a", prompt, max_tokens=1))])
    chunked = run(
        Engine(TINY, EngineConfig(max_num_batched_tokens=512)),
        arrivals=[(0.0, request("a", prompt, max_tokens=1))],
    )
    assert len(chunked.steps) == 4
    assert sum(s.duration for s in chunked.steps) > whole.steps[0].duration
    assert sum(s.duration for s in chunked.steps) < 1.5 * whole.steps[0].duration


def test_a_full_kv_cache_makes_requests_wait_and_preempts() -> None:
    # 64 blocks = 1,024 tokens for 12 requests that each grow to 500 tokens.
    engine = Engine(TINY, EngineConfig(num_gpu_blocks=64, max_model_len=1024))
    arrivals = [(0.0, request(f"r{i}", distinct_prompt(i, 300), max_tokens=200)) for i in range(12)]
    r = run(engine, arrivals=arrivals)
    assert max(s.num_waiting for s in r.stats_after) > 0
    assert engine.stats.num_preemptions > 0
    assert sum(s.num_preempted for s in r.steps) == engine.stats.num_preemptions
    assert sum(f.num_preemptions for f in r.finished.values()) == engine.stats.num_preemptions
    for i in range(12):
        assert r.token_indexes[f"r{i}"] == list(range(200)), "preemption must neither lose nor repeat tokens"
        assert r.finished[f"r{i}"].generation_tokens == 200
    assert max(s.kv_cache_usage for s in r.stats_after) > 0.9
    assert engine.stats.kv_cache_usage == 0
    assert engine.kv_cache.num_free_blocks == 64


def test_preempted_request_recomputes_and_may_hit_its_own_blocks() -> None:
    engine = Engine(TINY, EngineConfig(num_gpu_blocks=40, max_model_len=640))
    arrivals = [(0.0, request(f"r{i}", distinct_prompt(i, 200), max_tokens=150)) for i in range(3)]
    r = run(engine, arrivals=arrivals)
    preempted = [f for f in r.finished.values() if f.num_preemptions]
    assert preempted
    # The recomputed tokens show up as prompt work beyond the prompt, and some came back from cache.
    assert all(f.computed_prompt_tokens >= 200 for f in r.finished.values())
    stats = engine.stats
    assert stats.preempted_prefix_cache_hits_tokens > 0
    assert stats.prefix_cache_hits_tokens == 0, "re-admissions are counted apart, as vLLM does"
    assert stats.prefix_cache_queries_tokens == 3 * 200


def test_newest_running_request_is_preempted_first() -> None:
    engine = Engine(TINY, EngineConfig(num_gpu_blocks=10, max_model_len=160))
    engine.add_request(request("old", distinct_prompt(1, 60), max_tokens=90), 0.0)
    engine.add_request(request("new", distinct_prompt(2, 60), max_tokens=90), 0.0)
    r = run(engine)
    assert r.finished["new"].num_preemptions >= 1
    assert r.finished["old"].num_preemptions == 0
    assert r.finished["old"].finished < r.finished["new"].finished


def adapters_of(step: StepResult, adapter_of: dict[str, str]) -> set[str]:
    return {adapter_of[t.request_id] for t in step.tokens}


def test_max_loras_one_never_mixes_adapters_and_both_progress() -> None:
    engine = Engine(TINY, EngineConfig(max_loras=1, lora_load_s=0.005))
    adapter_of = {}
    arrivals = []
    for i in range(8):
        adapter = "lora-a" if i % 2 == 0 else "lora-b"
        adapter_of[f"r{i}"] = adapter
        # a and b interleaved, a new pair every 80 ms (a request lives ~70 ms): each adapter gets turns.
        arrivals.append(
            (0.08 * (i // 2), request(f"r{i}", distinct_prompt(i, 100), max_tokens=30, adapter=adapter))
        )
    r = run(engine, arrivals=arrivals)
    assert len(r.finished) == 8
    for step, stats in zip(r.steps, r.stats_after, strict=True):
        assert len(adapters_of(step, adapter_of)) <= 1
        assert len(stats.running_adapters) <= 1
        assert len(stats.resident_adapters) <= 1
    order = [next(iter(adapters_of(s, adapter_of))) for s in r.steps if s.tokens]
    switches = sum(1 for x, y in itertools.pairwise(order) if x != y)
    assert switches >= 3, "the adapters take turns"
    loads = [s for s in r.steps if s.lora_load_s]
    assert len(loads) == switches + 1
    assert all(s.lora_load_s == 0.005 and s.duration > 0.005 for s in loads)


def test_skipped_adapter_does_not_block_the_queue() -> None:
    engine = Engine(TINY, EngineConfig(max_loras=1))
    engine.add_request(request("a1", [1, 2, 3], max_tokens=20, adapter="a"), 0.0)
    now = engine.step(0.0).end
    engine.add_request(request("b1", [4, 5, 6], max_tokens=5, adapter="b"), now)
    engine.add_request(request("a2", [7, 8, 9], max_tokens=5, adapter="a"), now)
    engine.add_request(request("base", [7, 8, 9], max_tokens=5), now)
    step = engine.step(now)
    assert {t.request_id for t in step.tokens} == {"a1", "a2", "base"}
    assert engine.stats.waiting_adapters == ("b",)
    assert engine.stats.running_adapters == ("a",)
    engine.finish_request("b1", step.end)
    assert not engine.stats.waiting_adapters
    run(engine, step.end)
    assert not engine.stats.running_adapters


def test_adapter_gauges_follow_preemption() -> None:
    engine = Engine(TINY, EngineConfig(num_gpu_blocks=64, max_model_len=1024, max_loras=2))
    arrivals = [(0.0, request(f"r{i}", distinct_prompt(i, 300), 200, adapter="ab"[i % 2])) for i in range(8)]
    seen: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    r = run(
        engine,
        arrivals=arrivals,
        after_step=lambda e, _: seen.append((e.stats.running_adapters, e.stats.waiting_adapters)),
    )
    assert engine.stats.num_preemptions > 0
    assert {a for running, _ in seen for a in running} == {"a", "b"}
    assert any(waiting for _, waiting in seen)
    assert (engine.stats.running_adapters, engine.stats.waiting_adapters) == ((), ())
    assert len(r.finished) == 8


def test_two_lora_slots_keep_both_adapters_resident() -> None:
    engine = Engine(TINY, EngineConfig(max_loras=2, lora_load_s=0.01))
    arrivals = [
        (0.0, request("a", [1, 2], max_tokens=5, adapter="x")),
        (0.0, request("b", [3, 4], max_tokens=5, adapter="y")),
    ]
    r = run(engine, arrivals=arrivals)
    assert r.steps[0].lora_load_s == 0.02
    assert all(s.lora_load_s == 0 for s in r.steps[1:])
    assert set(engine.stats.resident_adapters) == {"x", "y"}
    r = run(engine, r.end, arrivals=[(r.end, request("c", [5], max_tokens=2, adapter="z"))])
    assert r.steps[0].lora_load_s == 0.01
    assert engine.stats.resident_adapters == ("y", "z"), "least recently used slot was evicted"


def test_priority_policy_serves_lower_numbers_first() -> None:
    def first_token_order(policy: str) -> list[str]:
        engine = Engine(TINY, EngineConfig(max_num_seqs=1, scheduling_policy=policy))
        arrivals = [
            (0.0, request(name, [1, 2, 3], max_tokens=2, priority=p))
            for name, p in [("p5", 5), ("p1", 1), ("p3", 3), ("p1b", 1)]
        ]
        r = run(engine, arrivals=arrivals)
        return sorted(r.finished, key=lambda rid: r.finished[rid].first_token or 0)

    assert first_token_order("priority") == ["p1", "p1b", "p3", "p5"]
    assert first_token_order("fcfs") == ["p5", "p1", "p3", "p1b"]


def test_priority_policy_preempts_the_lowest_priority() -> None:
    def preemptions(policy: str) -> dict[str, int]:
        engine = Engine(TINY, EngineConfig(num_gpu_blocks=10, max_model_len=160, scheduling_policy=policy))
        engine.add_request(request("low", distinct_prompt(1, 60), max_tokens=90, priority=10), 0.0)
        engine.add_request(request("high", distinct_prompt(2, 60), max_tokens=90, priority=0), 0.0)
        r = run(engine)
        return {rid: f.num_preemptions for rid, f in r.finished.items()}

    by_priority = preemptions("priority")
    assert by_priority["low"] >= 1 and by_priority["high"] == 0
    by_arrival = preemptions("fcfs")
    assert by_arrival["high"] >= 1 and by_arrival["low"] == 0


def test_priority_preemption_can_take_back_a_request_already_in_the_batch() -> None:
    # "low" is admitted first (alone), then "high" joins; when "high" needs a block, "low" - earlier
    # in the running list and already scheduled this step - is the victim and leaves the batch.
    engine = Engine(TINY, EngineConfig(num_gpu_blocks=10, max_model_len=160, scheduling_policy="priority"))
    engine.add_request(request("low", distinct_prompt(1, 60), max_tokens=90, priority=10), 0.0)
    now = engine.step(0.0).end
    engine.add_request(request("high", distinct_prompt(2, 60), max_tokens=90, priority=0), now)
    r = run(engine, now)
    assert r.finished["low"].num_preemptions >= 1
    assert r.finished["high"].num_preemptions == 0
    assert r.token_indexes["low"] == list(range(1, 90))
    assert engine.stats.kv_cache_usage == 0
