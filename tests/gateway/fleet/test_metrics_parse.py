"""gateway/fleet/metrics_parse.py: real captures, dialects, data-parallel pages, bad pages, fuzz."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fleet.metrics_parse import (
    MetricsParseError,
    MetricsParser,
    ReplicaMetrics,
    parse_metrics,
    prefilter,
)
from tests.vllm_fixtures import VLLM_FIXTURES

FIXTURES = VLLM_FIXTURES
LORA_PAGE = (FIXTURES / "metrics_lora_under_load.txt").read_text()
IDLE_PAGE = (FIXTURES / "metrics.txt").read_text()


def page(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def vllm_core(running: str = "1.0", waiting: str = "2.0", kv: str = "0.25") -> list[str]:
    return [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}',
        "# TYPE vllm:num_requests_waiting gauge",
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}',
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}',
    ]


# -- real captures -----------------------------------------------------------------------------


def test_real_page_with_lora_under_load() -> None:
    m = parse_metrics(LORA_PAGE)
    assert m == ReplicaMetrics(
        running=8,
        waiting=16,  # not doubled by vllm:num_requests_waiting_by_reason
        kv_usage=0.0019532442165659525,
        prefix_queries_tokens=2484,
        prefix_hits_tokens=0,
        preemptions=0,
        block_size=128,
        num_gpu_blocks=16384,
        max_loras=2,
        running_adapters=("lora-b", "lora-a"),  # the newest of four series
        waiting_adapters=("lora-b", "lora-a"),
        dialect="vllm",
    )
    # cross-check with the page's own kv_cache_size_tokens="2097152" label
    assert m.kv_capacity_tokens == 2_097_152


def test_real_idle_page_without_lora() -> None:
    m = parse_metrics(IDLE_PAGE)
    assert (m.running, m.waiting, m.kv_usage) == (0, 0, 0.0)
    assert (m.prefix_queries_tokens, m.prefix_hits_tokens) == (10128, 128)
    assert (m.block_size, m.num_gpu_blocks) == (128, 16384)
    assert m.max_loras is None
    assert m.running_adapters == () and m.waiting_adapters == ()


def test_prefilter_keeps_only_the_sample_lines_read() -> None:
    kept = prefilter(LORA_PAGE)
    assert len(kept) == 11  # 6 load/counter samples, 4 lora series, 1 cache config
    assert all(not line.startswith("#") for line in kept)
    assert not any("waiting_by_reason" in line or "_created" in line for line in kept)


# -- dialects ----------------------------------------------------------------------------------


def test_old_vllm_names() -> None:
    text = page(
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{model_name="m"} 3.0',
        "# TYPE vllm:num_requests_waiting gauge",
        'vllm:num_requests_waiting{model_name="m"} 1.0',
        "# TYPE vllm:gpu_cache_usage_perc gauge",
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.75',
        "# TYPE vllm:gpu_prefix_cache_queries_total counter",
        'vllm:gpu_prefix_cache_queries_total{model_name="m"} 640.0',
        "# TYPE vllm:gpu_prefix_cache_hits_total counter",
        'vllm:gpu_prefix_cache_hits_total{model_name="m"} 320.0',
        "# TYPE vllm:num_preemptions_total counter",
        'vllm:num_preemptions_total{model_name="m"} 7.0',
    )
    m = parse_metrics(text)
    assert (m.running, m.waiting, m.kv_usage) == (3, 1, 0.75)
    assert (m.prefix_queries_tokens, m.prefix_hits_tokens, m.preemptions) == (640, 320, 7)
    assert m.block_size is None and m.num_gpu_blocks is None and m.kv_capacity_tokens is None


def test_new_name_wins_when_both_are_present() -> None:
    text = page(*vllm_core(kv="0.5"), 'vllm:gpu_cache_usage_perc{model_name="m"} 0.9')
    assert parse_metrics(text).kv_usage == 0.5


def test_counter_written_without_total_suffix() -> None:
    text = page(*vllm_core(), "# TYPE vllm:num_preemptions counter", "vllm:num_preemptions 4")
    assert parse_metrics(text).preemptions == 4


def test_sglang() -> None:
    text = page(
        "# HELP sglang:num_running_reqs The number of running requests",
        "# TYPE sglang:num_running_reqs gauge",
        'sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 162.0',
        "# TYPE sglang:num_queue_reqs gauge",
        'sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2826.0',
        "# TYPE sglang:token_usage gauge",
        'sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28',
        "# TYPE sglang:max_total_num_tokens gauge",
        'sglang:max_total_num_tokens{name="meta-llama/Llama-3.1-8B-Instruct"} 161721.0',
        "# TYPE sglang:cache_hit_rate gauge",
        'sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0075',
    )
    m = parse_metrics(text)
    assert m.dialect == "sglang"
    assert (m.running, m.waiting, m.kv_usage) == (162, 2826, 0.28)
    assert (m.block_size, m.num_gpu_blocks, m.kv_capacity_tokens) == (1, 161721, 161721)
    assert (m.prefix_queries_tokens, m.max_loras, m.running_adapters) == (0, None, ())


# -- data parallel -----------------------------------------------------------------------------


def two_engines(kv0: float, kv1: float, blocks0: str | None, blocks1: str | None) -> str:
    lines = []
    for metric, v0, v1 in (
        ("vllm:num_requests_running", "3.0", "5.0"),
        ("vllm:num_requests_waiting", "0.0", "2.0"),
        ("vllm:kv_cache_usage_perc", str(kv0), str(kv1)),
        ("vllm:prefix_cache_queries_total", "100.0", "50.0"),
        ("vllm:prefix_cache_hits_total", "10.0", "5.0"),
    ):
        lines += [f'{metric}{{engine="0"}} {v0}', f'{metric}{{engine="1"}} {v1}']
    for engine, blocks in (("0", blocks0), ("1", blocks1)):
        if blocks is not None:
            lines.append(
                f'vllm:cache_config_info{{block_size="16",engine="{engine}",num_gpu_blocks="{blocks}"}} 1.0'
            )
    return page(*lines)


def test_engines_sum_running_waiting_counters_and_blocks() -> None:
    m = parse_metrics(two_engines(0.5, 0.1, "1000", "3000"))
    assert (m.running, m.waiting) == (8, 2)
    assert (m.prefix_queries_tokens, m.prefix_hits_tokens) == (150, 15)
    assert (m.block_size, m.num_gpu_blocks) == (16, 4000)


@pytest.mark.parametrize(
    ("kv0", "kv1", "blocks0", "blocks1", "expected"),
    [
        (0.5, 0.1, "1000", "3000", (0.5 * 1000 + 0.1 * 3000) / 4000),  # block-weighted mean
        (0.5, 0.1, "1000", "1000", 0.3),
        (0.5, 0.1, None, None, 0.5),  # no cache config: max, the conservative choice
        (0.2, 0.9, "1000", "None", 0.9),  # one engine's blocks unknown: max
    ],
)
def test_engines_kv_usage(
    kv0: float, kv1: float, blocks0: str | None, blocks1: str | None, expected: float
) -> None:
    assert parse_metrics(two_engines(kv0, kv1, blocks0, blocks1)).kv_usage == pytest.approx(expected)


def test_lora_newest_series_per_engine_unioned() -> None:
    def lora(engine: str, running: str, waiting: str, value: str) -> str:
        return (f'vllm:lora_requests_info{{engine="{engine}",max_lora="2",'
                f'running_lora_adapters="{running}",waiting_lora_adapters="{waiting}"}} {value}')

    text = page(
        *vllm_core(),
        lora("0", "a", "", "20.0"),
        lora("0", "x", "y", "10.0"),
        lora("1", "b,a", "c", "15.0"),
        lora("1", "", "", "NaN"),  # not a time: never the newest
    )
    m = parse_metrics(text)
    assert m.running_adapters == ("a", "b")
    assert m.waiting_adapters == ("c",)
    assert m.max_loras == 2


def test_lora_newest_series_says_none_running() -> None:
    text = page(
        *vllm_core(),
        'vllm:lora_requests_info{max_lora="1",running_lora_adapters="a",waiting_lora_adapters="a"} 1.0e9',
        'vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 2.0e9',
    )
    m = parse_metrics(text)
    assert (m.max_loras, m.running_adapters, m.waiting_adapters) == (1, (), ())


# -- bad pages ---------------------------------------------------------------------------------

BAD_PAGES = {
    "empty": "",
    "html": "<html><body>502 Bad Gateway</body></html>",
    "no running gauge": page(*vllm_core()[3:]),
    "no waiting gauge": page(*vllm_core()[:3], *vllm_core()[5:]),
    "no kv gauge": page(*vllm_core()[:5]),
    "nan running": page(*vllm_core(running="NaN")),
    "negative waiting": page(*vllm_core(waiting="-1.0")),
    "infinite kv": page(*vllm_core(kv="+Inf")),
    "unparseable value": page(*vllm_core(running="eight")),
    "truncated inside labels": page(*vllm_core()) + 'vllm:cache_config_info{block_size="12',
    "unclosed label quote": page(*vllm_core()[:2], 'vllm:num_requests_running{engine="0} 1.0'),
    "truncated before kv": LORA_PAGE[: LORA_PAGE.index("vllm:kv_cache_usage_perc{")],
}


@pytest.mark.parametrize("text", BAD_PAGES.values(), ids=BAD_PAGES.keys())
def test_bad_pages_raise_metrics_parse_error(text: str) -> None:
    with pytest.raises(MetricsParseError):
        parse_metrics(text)


def test_invalid_optional_signals_are_dropped_not_fatal() -> None:
    text = page(
        *vllm_core(kv="1.5"),  # above 1: clamped
        'vllm:prefix_cache_queries_total{engine="0"} NaN',
        'vllm:prefix_cache_hits_total{engine="0"} -3.0',
        'vllm:cache_config_info{block_size="None",engine="0",num_gpu_blocks="16384"} 1.0',
        'vllm:lora_requests_info{max_lora="two",running_lora_adapters="a",waiting_lora_adapters=""} 5.0',
    )
    m = parse_metrics(text)
    assert m.kv_usage == 1.0
    assert (m.prefix_queries_tokens, m.prefix_hits_tokens) == (0, 0)
    assert m.block_size is None and m.num_gpu_blocks is None
    assert (m.max_loras, m.running_adapters) == (None, ("a",))


def test_broken_line_of_an_unread_family_is_ignored() -> None:
    text = page(*vllm_core(), 'vllm:request_success_total{finished_reason="stop" garbage', "}}}")
    assert parse_metrics(text).running == 1


def test_truncated_after_the_load_gauges_gives_partial_result() -> None:
    text = LORA_PAGE[: LORA_PAGE.index("# HELP vllm:lora_requests_info")]
    m = parse_metrics(text)
    assert (m.running, m.waiting) == (8, 16)
    assert m.block_size is None and m.max_loras is None


def test_duplicate_series_line_counts_once() -> None:
    text = page(*vllm_core(running="4.0"), 'vllm:num_requests_running{engine="0",model_name="m"} 4.0')
    assert parse_metrics(text).running == 4


# -- the per-replica parser's memo -------------------------------------------------------------


def test_parser_reuses_unchanged_lines_but_reads_changed_ones() -> None:
    parser = MetricsParser()
    assert parser.parse(LORA_PAGE).running == 8
    changed = LORA_PAGE.replace('vllm:num_requests_running{engine="0",model_name="tiny-llama"} 8.0',
                                'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0')
    m = parser.parse(changed)
    assert (m.running, m.num_gpu_blocks, m.running_adapters) == (3, 16384, ("lora-b", "lora-a"))
    assert parser.parse(IDLE_PAGE) == parse_metrics(IDLE_PAGE)
    with pytest.raises(MetricsParseError):
        parser.parse("garbage")
    assert parser.parse(LORA_PAGE) == parse_metrics(LORA_PAGE)


# -- fuzz --------------------------------------------------------------------------------------


def parses_or_refuses(parser: MetricsParser, text: str) -> None:
    try:
        m = parser.parse(text)
    except MetricsParseError:
        return
    assert isinstance(m, ReplicaMetrics)
    assert m.running >= 0 and m.waiting >= 0
    assert 0.0 <= m.kv_usage <= 1.0 and not math.isnan(m.kv_usage)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_fuzz_random_text(text: str) -> None:
    parses_or_refuses(MetricsParser(), text)


@settings(max_examples=300, deadline=None)
@given(st.binary())
def test_fuzz_random_bytes(body: bytes) -> None:
    parses_or_refuses(MetricsParser(), body.decode("utf-8", "replace"))


_NAMES = st.sampled_from([
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_hits_total", "vllm:cache_config_info", "vllm:lora_requests_info",
    "sglang:num_running_reqs", "sglang:token_usage", "sglang:max_total_num_tokens",
])
_LINE = st.tuples(_NAMES, st.text(max_size=40), st.text(max_size=12)).map(
    lambda t: f"{t[0]}{{{t[1]}}} {t[2]}"
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_LINE, st.sampled_from(prefilter(LORA_PAGE))), max_size=12))
def test_fuzz_lines_of_read_families(lines: list[str]) -> None:
    parses_or_refuses(MetricsParser(), "\n".join(lines))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, len(LORA_PAGE)), st.integers(0, len(LORA_PAGE)), st.text(max_size=3))
def test_fuzz_truncated_and_spliced_real_page(cut: int, at: int, junk: str) -> None:
    parser = MetricsParser()
    parses_or_refuses(parser, LORA_PAGE)
    parses_or_refuses(parser, LORA_PAGE[:cut])
    parses_or_refuses(parser, LORA_PAGE[:at] + junk + LORA_PAGE[at + len(junk):])
