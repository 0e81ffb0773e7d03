"""The engine model in virtual time: prefix caching, tokens, finishing, limits, stats, determinism."""

from __future__ import annotations

import pytest

from simulator.engine import Engine, EngineConfig, EngineRequest
from simulator.kv_cache import compute_block_keys
from simulator.profiles import get_profile
from simulator.tokenizer import FILLER_WORDS, decode_token
from tests.simulator.engine_run import distinct_prompt, request, run

TINY = get_profile("tiny")


def ttft(engine: Engine, req: EngineRequest, now: float) -> tuple[float, float, int]:
    """Run one request alone from `now`; (TTFT, end time, cached tokens)."""
    engine.add_request(req, now)
    r = run(engine, now)
    f = r.finished[req.request_id]
    assert f.first_token is not None
    return f.first_token - f.arrival, r.end, f.cached_tokens


@pytest.mark.parametrize("profile", ["tiny", "llama-3-8b-h100", "qwen3-32b-h200"])
def test_same_long_prompt_twice_hits_the_cache(profile: str) -> None:
    engine = Engine(get_profile(profile))
    prompt = distinct_prompt(1, 2000)
    cold, now, cached = ttft(engine, request("a", prompt), 0.0)
    assert cached == 0
    hits_before = engine.stats.prefix_cache_hits_tokens
    warm, _, cached = ttft(engine, request("b", prompt), now + 1.0)
    # 2000 tokens = 125 full blocks, but the last token is always computed: 124 blocks hit.
    assert cached == 124 * 16
    assert engine.stats.prefix_cache_hits_tokens - hits_before == 124 * 16
    assert warm * 3 <= cold


def test_identical_prompts_in_one_step_compute_the_prefix_once() -> None:
    engine = Engine(TINY)
    prompt = distinct_prompt(9, 2000)
    r = run(engine, arrivals=[(0.0, request(f"r{i}", prompt)) for i in range(3)])
    assert r.steps[0].num_prefill_tokens == 2000 + 2 * 16
    assert [r.finished[f"r{i}"].cached_tokens for i in range(3)] == [0, 1984, 1984]
    # 125 blocks of prompt, plus one each for the two copies' recomputed last block.
    assert round(r.stats_after[0].kv_cache_usage * engine.num_gpu_blocks) == 125 + 2


def test_prefix_stats_count_tokens_of_admitted_requests() -> None:
    engine = Engine(TINY)
    prompt = distinct_prompt(2, 100)
    run(engine, arrivals=[(0.0, request("a", prompt))])
    run(engine, 1.0, arrivals=[(1.0, request("b", [*prompt, 5, 6]))])
    s = engine.stats
    assert s.prefix_cache_queries_tokens == 100 + 102
    assert s.prefix_cache_hits_tokens == 96


def test_adapter_separates_the_prefix_cache() -> None:
    engine = Engine(TINY, EngineConfig(max_loras=2))
    prompt = distinct_prompt(3, 200)
    _, now, cached = ttft(engine, request("a1", prompt, adapter="lora-a"), 0.0)
    _, now, cached_b = ttft(engine, request("b1", prompt, adapter="lora-b"), now)
    _, now, cached_base = ttft(engine, request("base", prompt), now)
    _, now, cached_a = ttft(engine, request("a2", prompt, adapter="lora-a"), now)
    assert (cached, cached_b, cached_base) == (0, 0, 0)
    assert cached_a == 192


def test_only_full_blocks_are_cached() -> None:
    engine = Engine(TINY)
    prompt = distinct_prompt(4, 40)  # 2 full blocks + 8 tokens
    _, now, _ = ttft(engine, request("a", prompt, max_tokens=1), 0.0)
    assert engine.kv_cache.num_cached_blocks == 2
    _, now, cached = ttft(engine, request("b", [*prompt, 1, 1, 1, 1, 1, 1, 1], max_tokens=1), now)
    assert cached == 32


def test_whole_prompt_hit_still_computes_the_last_token() -> None:
    engine = Engine(TINY)
    prompt = distinct_prompt(5, 32)  # exactly 2 blocks
    _, now, _ = ttft(engine, request("a", prompt), 0.0)
    _, _, cached = ttft(engine, request("b", prompt), now)
    assert cached == 16


def test_generated_tokens_fill_cached_blocks() -> None:
    engine = Engine(TINY)
    prompt = distinct_prompt(6, 30)
    engine.add_request(request("turn1", prompt, max_tokens=20), 0.0)
    first = run(engine)
    outputs = [t.token_id for s in first.steps for t in s.tokens]
    # Next turn: the conversation so far (prompt + answer) plus a question. 30 + 20 = 50 tokens, of
    # which the 49 computed ones fill 3 blocks.
    follow_up = prompt + outputs + distinct_prompt(7, 10)
    _, _, cached = ttft(engine, request("turn2", follow_up), first.end)
    assert cached == 48


def test_freed_blocks_are_reused_oldest_first_tail_first() -> None:
    engine = Engine(TINY, EngineConfig(num_gpu_blocks=20, max_model_len=320))
    a, b = distinct_prompt(10, 100), distinct_prompt(11, 100)  # 7 blocks each, 6 of them full
    _, now, _ = ttft(engine, request("a", a, max_tokens=1), 0.0)
    _, now, _ = ttft(engine, request("b", b, max_tokens=1), now)

    def cached_blocks(prompt: list[int]) -> int:
        return len(engine.kv_cache.find_cached_prefix(compute_block_keys(prompt, 16)))

    assert (cached_blocks(a), cached_blocks(b)) == (6, 6)
    # Free queue now: 6 never-used blocks, then a's blocks tail first, then b's. A new 9-block prompt
    # takes the 6 unused blocks and a's last 3 (its partial block and 2 full ones).
    _, now, _ = ttft(engine, request("c", distinct_prompt(12, 140), max_tokens=1), now)
    assert cached_blocks(b) == 6, "b was freed last: untouched"
    assert cached_blocks(a) == 4, "a lost its tail, kept its head"
    _, now, cached_a = ttft(engine, request("a2", a, max_tokens=1), now)
    assert cached_a == 64


def test_every_request_gets_exactly_max_tokens_tokens_in_order() -> None:
    engine = Engine(TINY)
    arrivals = [
        (0.001 * i, request(f"r{i}", distinct_prompt(i, 50 + 37 * i), max_tokens=1 + 5 * i)) for i in range(8)
    ]
    r = run(engine, arrivals=arrivals)
    for i in range(8):
        assert r.token_indexes[f"r{i}"] == list(range(1 + 5 * i))
        f = r.finished[f"r{i}"]
        assert (f.reason, f.generation_tokens, f.prompt_tokens) == ("length", 1 + 5 * i, 50 + 37 * i)
    last_tokens = [t for s in r.steps for t in s.tokens if t.finished_reason is not None]
    assert sorted(t.request_id for t in last_tokens) == sorted(f"r{i}" for i in range(8))
    assert engine.stats.kv_cache_usage == 0
    assert not engine.has_unfinished()


def test_output_is_seeded_filler_text() -> None:
    engine = Engine(TINY)
    engine.add_request(EngineRequest("x", [1, 2, 3], 12, seed=0), 0.0)
    engine.add_request(EngineRequest("y", [1, 2, 3], 12, seed=5), 0.0)
    r = run(engine)
    text = {
        rid: "".join(decode_token(t.token_id) for s in r.steps for t in s.tokens if t.request_id == rid)
        for rid in "xy"
    }
    assert text["x"].split() == list(FILLER_WORDS[:12])
    assert text["y"].split() == list(FILLER_WORDS[5:17])


def test_times_of_a_finished_request() -> None:
    engine = Engine(TINY)
    engine.add_request(request("a", distinct_prompt(1, 500), max_tokens=3), 2.0)
    r = run(engine, 2.5)
    f = r.finished["a"]
    assert f.arrival == 2.0
    assert f.first_scheduled == 2.5
    assert f.first_token == r.steps[0].end
    assert f.finished == r.steps[2].end == r.end
    assert f.computed_prompt_tokens == 500
    assert f.num_preemptions == 0


def test_abort_frees_blocks_at_once() -> None:
    engine = Engine(TINY)
    engine.add_request(request("a", distinct_prompt(1, 300), max_tokens=100), 0.0)
    now = 0.0
    for _ in range(5):
        now = engine.step(now).end
    assert engine.stats.kv_cache_usage > 0
    f = engine.finish_request("a", now)
    assert f is not None
    assert (f.reason, f.generation_tokens, f.finished) == ("abort", 5, now)
    assert engine.stats.kv_cache_usage == 0
    assert not engine.has_unfinished()
    assert engine.finish_request("a", now) is None
    assert engine.finish_request("nobody", now) is None
    assert engine.step(now).duration == 0
    assert engine.stats.finished == {"abort": 1}


def test_abort_a_waiting_request_and_stop() -> None:
    engine = Engine(TINY, EngineConfig(max_num_seqs=1))
    engine.add_request(request("a", [1, 2, 3], max_tokens=10), 0.0)
    engine.add_request(request("b", [4, 5, 6], max_tokens=10), 0.0)
    now = engine.step(0.0).end
    assert (engine.stats.num_running, engine.stats.num_waiting) == (1, 1)
    waiting = engine.finish_request("b", now)
    assert waiting is not None and waiting.first_scheduled is None and waiting.first_token is None
    assert engine.stats.num_waiting == 0
    stopped = engine.finish_request("a", now, reason="stop")
    assert stopped is not None and stopped.reason == "stop" and stopped.generation_tokens == 1
    assert engine.stats.finished == {"abort": 1, "stop": 1}


def test_idle_step_takes_no_time() -> None:
    result = Engine(TINY).step(3.0)
    assert (result.duration, result.end, result.tokens, result.finished) == (0.0, 3.0, [], [])


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "expected"),
    [
        (10, 10, None),
        (4000, 96, None),
        (0, 10, "The decoder prompt cannot be empty"),
        (10, 0, "max_tokens must be at least 1, got 0."),
        (
            10,
            5000,
            "max_tokens=5000 cannot be greater than max_model_len=4096. Please request fewer output tokens. "
            "(parameter=max_tokens, value=5000)",
        ),
        (
            4096,
            1,
            "This model's maximum context length is 4096 tokens. However, your request has 4096 input "
            "tokens. Please reduce the length of the input messages.",
        ),
        (
            4000,
            97,
            "'max_tokens' or 'max_completion_tokens' is too large: 97. This model's maximum context length "
            "is 4096 tokens and your request has 4000 input tokens (97 > 4096 - 4000).",
        ),
    ],
)
def test_validate_like_vllm(prompt: int, max_tokens: int, expected: str | None) -> None:
    assert Engine(TINY).validate(prompt, max_tokens) == expected


def test_add_request_rejects_what_cannot_run() -> None:
    engine = Engine(TINY)
    with pytest.raises(ValueError, match="maximum context length"):
        engine.add_request(request("long", [1] * 4000, max_tokens=200), 0.0)
    with pytest.raises(ValueError, match="LoRA is disabled"):
        engine.add_request(request("lora", [1], adapter="a"), 0.0)
    engine.add_request(request("dup", [1]), 0.0)
    with pytest.raises(ValueError, match="already"):
        engine.add_request(request("dup", [2]), 0.0)


def test_config_defaults_and_overrides() -> None:
    engine = Engine(TINY)
    assert (engine.num_gpu_blocks, engine.max_model_len) == (TINY.num_gpu_blocks(16), 4096)
    small = Engine(TINY, EngineConfig(num_gpu_blocks=64, block_size=8))
    assert small.max_model_len == 512, "max_model_len defaults down to what the cache holds"
    assert Engine(TINY, EngineConfig(max_model_len=2048)).max_model_len == 2048
    stats = small.stats
    assert (stats.num_gpu_blocks, stats.block_size, stats.max_model_len) == (64, 8, 512)


@pytest.mark.parametrize(
    "config",
    [
        EngineConfig(scheduling_policy="lottery"),
        EngineConfig(num_gpu_blocks=10, max_model_len=4096),
        EngineConfig(block_size=0),
        EngineConfig(max_num_seqs=0),
        EngineConfig(max_loras=-1),
    ],
)
def test_bad_config_is_refused(config: EngineConfig) -> None:
    with pytest.raises(ValueError):
        Engine(TINY, config)


def test_reset_prefix_cache() -> None:
    engine = Engine(TINY)
    prompt = distinct_prompt(1, 200)
    _, now, _ = ttft(engine, request("a", prompt), 0.0)
    engine.add_request(request("busy", [1, 2, 3], max_tokens=5), now)
    now = engine.step(now).end
    assert engine.reset_prefix_cache() is False, "like vLLM: refused while blocks are in use"
    now = run(engine, now).end
    assert engine.reset_prefix_cache() is True
    _, _, cached = ttft(engine, request("b", prompt), now)
    assert cached == 0


def test_token_counters() -> None:
    engine = Engine(TINY)
    prompt = distinct_prompt(1, 300)
    run(
        engine,
        arrivals=[(0.0, request("a", prompt, max_tokens=7)), (0.0, request("b", prompt, max_tokens=3))],
    )
    s = engine.stats
    assert s.prompt_tokens == 600, "cached and computed prompt tokens both count"
    assert s.generation_tokens == 10
    assert s.steps > 0 and s.busy_s > 0
    assert s.scheduled_tokens >= 300 + 10 - 1


def test_same_calls_same_results() -> None:
    def once() -> list[tuple[float, int, int, tuple[tuple[str, int], ...]]]:
        engine = Engine(TINY, EngineConfig(num_gpu_blocks=80, max_model_len=1024, max_num_batched_tokens=300))
        arrivals = [
            (0.002 * i, request(f"r{i}", distinct_prompt(i % 3, 100 + 50 * i), max_tokens=40))
            for i in range(10)
        ]
        r = run(engine, arrivals=arrivals)
        return [
            (
                s.duration,
                s.num_prefill_tokens,
                s.num_decode_seqs,
                tuple((t.request_id, t.token_id) for t in s.tokens),
            )
            for s in r.steps
        ]

    assert once() == once()
