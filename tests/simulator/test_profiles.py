"""Built-in profiles against napkin.md's worked numbers (within 10%), and the roofline's shape."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.engine import Engine, EngineRequest
from simulator.profiles import PROFILES, get_profile

# profile, KV tokens per replica, blocks of 16, decode step at batch 1 (s), prefill of 2,048 tokens (s)
NAPKIN = [
    ("llama-3-8b-h100", 412e3, 25.7e3, 7.2e-3, 51e-3),
    ("llama-3-8b-h200", 830e3, 51.9e3, 5.1e-3, 51e-3),
    ("llama-3-70b-h100-tp4", 424e3, 26.5e3, 15e-3, 112e-3),
    ("qwen3-32b-h200", 226e3, 14.1e3, 19.5e-3, 209e-3),
]


def causal_pairs(n: int) -> int:
    return n * (n + 1) // 2


@pytest.mark.parametrize(("name", "kv_tokens", "blocks", "decode_s", "prefill_s"), NAPKIN)
def test_profile_matches_napkin(
    name: str, kv_tokens: float, blocks: float, decode_s: float, prefill_s: float
) -> None:
    p = get_profile(name)
    assert p.kv_capacity_tokens() == pytest.approx(kv_tokens, rel=0.10)
    assert p.num_gpu_blocks(16) == pytest.approx(blocks, rel=0.10)
    assert p.step_time(0, 1, 1) == pytest.approx(decode_s, rel=0.10)
    assert p.step_time(2048, 0, 2048, causal_pairs(2048)) == pytest.approx(prefill_s, rel=0.10)


def test_tiny_profile_is_small_and_fast() -> None:
    p = get_profile("tiny")
    assert p.model_name == "tiny-llama"
    assert p.max_model_len == 4096
    assert 14_000 <= p.kv_capacity_tokens() <= 18_000
    assert p.step_time(0, 1, 1) == pytest.approx(2e-3, rel=0.15)
    assert 10e-3 <= p.step_time(2048, 0, 2048, causal_pairs(2048)) <= 20e-3


def test_model_names_and_context() -> None:
    assert {p.model_name for p in PROFILES.values()} >= {
        "llama-3-8b",
        "llama-3-70b",
        "qwen3-32b",
        "tiny-llama",
    }
    assert get_profile("llama-3-8b-h100").max_model_len == 8192
    assert get_profile("llama-3-70b-h100-tp4").max_model_len == 8192
    assert get_profile("qwen3-32b-h200").max_model_len == 32768


def test_kv_bytes_per_token_follow_the_model_table() -> None:
    assert get_profile("llama-3-8b-h100").kv_bytes_per_token == 128 * 1024
    assert get_profile("llama-3-70b-h100-tp4").kv_bytes_per_token == 320 * 1024
    assert get_profile("qwen3-32b-h200").kv_bytes_per_token == 256 * 1024


def test_unknown_profile_lists_known_names() -> None:
    with pytest.raises(ValueError, match="llama-3-8b-h100") as e:
        get_profile("gpt-5-on-a-toaster")
    assert "tiny" in str(e.value)


def test_decode_is_memory_bound_and_grows_with_context() -> None:
    p = get_profile("llama-3-8b-h100")
    short, long = p.step_time(0, 64, 64 * 100), p.step_time(0, 64, 64 * 4000)
    assert long > short
    # 64 x 4000 tokens of KV is 33.5 GB: twice the weights, so about three times the weight-only time.
    assert long == pytest.approx(
        p.step_time(0, 1, 0) + 64 * 4000 * p.kv_bytes_per_token / (3.35e12 * 0.72), rel=0.01
    )


def test_prefill_is_compute_bound_and_attention_grows_quadratically() -> None:
    p = get_profile("llama-3-8b-h100")
    no_attention = p.step_time(8192, 0, 8192, 0)
    with_attention = p.step_time(8192, 0, 8192, causal_pairs(8192))
    assert with_attention > no_attention * 1.1
    assert p.step_time(4096, 0, 4096) == pytest.approx(
        2 * p.step_time(2048, 0, 2048) - p.step_overhead_s, rel=1e-9
    )


def test_tensor_parallel_splits_weights_and_kv() -> None:
    p = get_profile("llama-3-70b-h100-tp4")
    tp1 = dataclasses.replace(p, tp=1)
    assert p.step_time(0, 1, 1000) < tp1.step_time(0, 1, 1000) / 3


def test_block_count_rejects_bad_block_size() -> None:
    with pytest.raises(ValueError):
        get_profile("tiny").num_gpu_blocks(0)


def test_roofline_equals_step_time() -> None:
    p = get_profile("qwen3-32b-h200")
    r = p.roofline()
    for args in [(0, 1, 10, 10), (512, 3, 9000, 200_000), (2048, 0, 2048, causal_pairs(2048))]:
        assert r.step_time(args[0] + args[1], args[2], args[3]) == pytest.approx(
            p.step_time(*args), rel=1e-12
        )


@pytest.mark.parametrize(("name", "kv_tokens", "blocks", "decode_s", "prefill_s"), NAPKIN)
def test_engine_in_virtual_time_matches_napkin(
    name: str, kv_tokens: float, blocks: float, decode_s: float, prefill_s: float
) -> None:
    engine = Engine(get_profile(name))
    stats = engine.stats
    assert stats.num_gpu_blocks * stats.block_size == pytest.approx(kv_tokens, rel=0.10)
    assert stats.num_gpu_blocks == pytest.approx(blocks, rel=0.10)

    engine.add_request(EngineRequest("prefill", list(range(1, 2049)), max_tokens=1), 0.0)
    step = engine.step(0.0)
    assert step.num_prefill_tokens == 2048
    assert step.duration == pytest.approx(prefill_s, rel=0.10)

    engine.add_request(EngineRequest("decode", [7], max_tokens=3), step.end)
    steps = [engine.step(step.end)]
    steps.append(engine.step(steps[-1].end))
    assert steps[-1].num_decode_seqs == 1
    assert steps[-1].duration == pytest.approx(decode_s, rel=0.10)
