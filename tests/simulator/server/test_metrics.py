"""The replica's /metrics text: vLLM's names, types, labels and buckets, parsed as a scraper would."""

from __future__ import annotations

from dataclasses import dataclass, replace

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from simulator.server.metrics import ReplicaMetrics
from tests.vllm_fixtures import VLLM_FIXTURES

FIXTURES = VLLM_FIXTURES
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds")


@dataclass(frozen=True)
class Stats:
    num_running: int = 2
    num_waiting: int = 1
    kv_cache_usage: float = 0.25
    prefix_cache_queries_tokens: int = 100
    prefix_cache_hits_tokens: int = 32
    num_preemptions: int = 3
    prompt_tokens: int = 100
    generation_tokens: int = 40
    running_adapters: tuple[str, ...] = ()
    waiting_adapters: tuple[str, ...] = ()


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def make(stats: list[Stats], max_loras: int = 0) -> ReplicaMetrics:
    return ReplicaMetrics("tiny-llama", lambda: stats[0], max_loras=max_loras, time_scale=10.0,
                          cache_config={"block_size": "16", "num_gpu_blocks": "64",
                                        "enable_prefix_caching": "True"},
                          wall_clock=Clock())


def samples(text: str) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def types(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_every_required_series_with_vllm_types_and_labels() -> None:
    metrics = make([Stats()])
    metrics.record_finished("length", arrival=1.0, first_scheduled=1.5, first_token=2.0, finished=4.0)
    metrics.record_finished("abort", arrival=1.0, first_scheduled=None, first_token=None, finished=1.2)
    text = metrics.render().decode()
    kinds = types(text)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:cache_config_info"):
        assert kinds[name] == "gauge"
    for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions",
                 "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success"):
        assert kinds[name] == "counter"
    for name in HISTOGRAMS:
        assert kinds[name] == "histogram"
    got = samples(text)
    labels = {"engine": "0", "model_name": "tiny-llama"}
    assert got["vllm:num_requests_running"] == [Sample("vllm:num_requests_running", labels, 2.0)]
    assert got["vllm:kv_cache_usage_perc"][0].value == 0.25
    assert got["vllm:prefix_cache_hits_total"][0].value == 32
    assert "vllm:prefix_cache_hits_created" in got
    success = {s.labels["finished_reason"]: s.value for s in got["vllm:request_success_total"]}
    assert success == {"stop": 0, "length": 1, "abort": 1, "error": 0, "repetition": 0}
    cache = got["vllm:cache_config_info"][0]
    assert cache.value == 1.0
    expected = {"block_size": "16", "num_gpu_blocks": "64", "enable_prefix_caching": "True"}
    assert expected.items() <= cache.labels.items()
    assert "model_name" not in cache.labels
    assert "vllm:lora_requests_info" not in got  # only with LoRA enabled


def test_histograms_use_vllms_buckets_and_observe_per_request() -> None:
    metrics = make([Stats()])
    metrics.record_finished("length", arrival=1.0, first_scheduled=1.5, first_token=2.0, finished=4.0)
    metrics.itl.observe_n(0.02, 15)
    ours = samples(metrics.render().decode())
    theirs = samples((FIXTURES / "metrics.txt").read_text())
    for name in HISTOGRAMS:
        bounds = [s.labels["le"] for s in ours[name + "_bucket"]]
        assert bounds == [s.labels["le"] for s in theirs[name + "_bucket"]], name
    count = {name: ours[name + "_count"][0].value for name in HISTOGRAMS}
    assert count == dict.fromkeys(HISTOGRAMS, 1.0) | {"vllm:inter_token_latency_seconds": 15.0}
    assert ours["vllm:time_to_first_token_seconds_sum"][0].value == 1.0
    assert ours["vllm:e2e_request_latency_seconds_sum"][0].value == 3.0
    assert ours["vllm:request_queue_time_seconds_sum"][0].value == 0.5
    le = {s.labels["le"]: s.value for s in ours["vllm:inter_token_latency_seconds_bucket"]}
    assert (le["0.01"], le["0.025"], le["+Inf"]) == (0.0, 15.0, 15.0)


def test_gauges_are_read_at_scrape_time() -> None:
    stats = [Stats(num_waiting=1)]
    metrics = make(stats)
    assert samples(metrics.render().decode())["vllm:num_requests_waiting"][0].value == 1
    stats[0] = replace(stats[0], num_waiting=7)
    assert samples(metrics.render().decode())["vllm:num_requests_waiting"][0].value == 7


def test_lora_info_keeps_one_timestamped_series_per_combination() -> None:
    stats = [Stats(running_adapters=("a",), waiting_adapters=("b",))]
    metrics = make(stats, max_loras=1)
    first = samples(metrics.render().decode())["vllm:lora_requests_info"]
    assert [(s.labels, s.value) for s in first] == [
        ({"max_lora": "1", "running_lora_adapters": "a", "waiting_lora_adapters": "b"}, 1002.0)]
    stats[0] = replace(stats[0], running_adapters=("b", "a"), waiting_adapters=())
    second = samples(metrics.render().decode())["vllm:lora_requests_info"]
    newest = max(second, key=lambda s: s.value)
    assert len(second) == 2
    assert (newest.labels["running_lora_adapters"], newest.labels["waiting_lora_adapters"]) == ("b,a", "")


def test_the_simulators_own_series_are_named_as_such() -> None:
    metrics = make([Stats()])
    metrics.observe_step(0.02, lag=0.003)
    metrics.observe_step(0.02, lag=None)
    got = samples(metrics.render().decode())
    assert got["kvgate_sim_time_scale"][0].value == 10.0
    assert got["kvgate_sim_steps_total"][0].value == 2
    assert got["kvgate_sim_step_lag_seconds_count"][0].value == 1
    assert got["kvgate_sim_step_lag_seconds_sum"][0].value == 0.003
