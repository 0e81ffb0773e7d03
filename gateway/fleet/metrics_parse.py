"""Prometheus text from a replica's `/metrics` -> `ReplicaMetrics`.

Dialects: vLLM (V1 names and the pre-0.10 `vllm:gpu_*` ones) and SGLang. Samples go through
prometheus-client's parser, but only after a regex prefilter keeps the sample lines of the few
families read here: the parser is pure Python, and on the real 55 KB vLLM 0.32 page (~650 lines) it
took 21-77 ms here against 1.5-2.8 ms for the 11 kept lines (timeit on the fixture, 2-core machine
under load). `MetricsParser` also reuses the parse of lines that did not change
since the replica's previous page: 0.1-0.5 ms per page. Lines of other families are never parsed,
so a broken line in a family kvgate does not read cannot fail the scrape. Samples are read by name
(counters with or without `_total`); HELP and TYPE lines are not needed.

Contract for bad pages (`parse_metrics` raises nothing but `MetricsParseError`):
- a kept line the parser rejects, or no running-requests gauge of any dialect -> `MetricsParseError`;
- the three load signals (running, waiting, KV usage) are required: missing, NaN, infinite or
  negative -> `MetricsParseError` (the scraper counts it as a failed scrape);
- every other signal is optional: missing or invalid -> 0 for counters, None / () for the rest.
KV usage above 1 is clamped to 1.

Data-parallel replicas write one series per `engine` label: running and waiting are summed, and
KV usage is the mean weighted by each engine's `num_gpu_blocks` (so it stays "used share of the
replica's KV") when every engine's block count is known, else the max (the conservative choice).
`num_gpu_blocks` is the sum over engines.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

Dialect = Literal["vllm", "sglang"]


class MetricsParseError(ValueError):
    """The page cannot give the load signals routing needs; the message says why (short)."""


@dataclass(frozen=True, slots=True)
class ReplicaMetrics:
    """One scrape's worth of a replica's own view of itself.

    `running`/`waiting` are requests; `kv_usage` is a fraction in [0, 1]; the prefix counters are
    tokens since the replica started (hit rate = delta hits / delta queries between two scrapes);
    `block_size` is tokens per KV block and `num_gpu_blocks` the block count summed over engines
    (both None until the replica reports its cache config). Adapter tuples keep the replica's order.
    """

    running: int
    waiting: int
    kv_usage: float
    prefix_queries_tokens: int = 0
    prefix_hits_tokens: int = 0
    preemptions: int = 0
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    max_loras: int | None = None
    running_adapters: tuple[str, ...] = ()
    waiting_adapters: tuple[str, ...] = ()
    dialect: Dialect = "vllm"

    @property
    def kv_capacity_tokens(self) -> int | None:
        if self.block_size is None or self.num_gpu_blocks is None:
            return None
        return self.block_size * self.num_gpu_blocks


@dataclass(frozen=True, slots=True)
class _Names:
    """Sample names of one dialect without `_total`, new names first (the first present wins)."""

    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_usage: tuple[str, ...]
    prefix_queries: tuple[str, ...] = ()
    prefix_hits: tuple[str, ...] = ()
    preemptions: tuple[str, ...] = ()


_VLLM = _Names(
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    prefix_queries=("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    prefix_hits=("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    preemptions=("vllm:num_preemptions",),
)
_SGLANG = _Names(
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_usage=("sglang:token_usage",),
)
_CACHE_CONFIG = "vllm:cache_config_info"
_LORA_INFO = "vllm:lora_requests_info"
_SGLANG_CAPACITY = "sglang:max_total_num_tokens"  # KV capacity in tokens (page size 1)


def _family_stems() -> frozenset[str]:
    stems: set[str] = {_CACHE_CONFIG, _LORA_INFO, _SGLANG_CAPACITY}
    for names in (_VLLM, _SGLANG):
        stems.update(names.running + names.waiting + names.kv_usage + names.prefix_queries
                     + names.prefix_hits + names.preemptions)
    return frozenset(stems)


_STEMS = _family_stems()
_COUNTER_STEMS = frozenset(_VLLM.prefix_queries + _VLLM.prefix_hits + _VLLM.preemptions)

# Every sample name parse_metrics reads, for exporters that can restrict a page to some names
# (prometheus-client's exposition honors `?name[]=...`, ignored elsewhere).
SAMPLE_NAMES: tuple[str, ...] = tuple(sorted(_STEMS | {s + "_total" for s in _COUNTER_STEMS}))


def _keep_pattern() -> re.Pattern[str]:
    """Sample lines of the families read here, found in one C-level pass over the page.

    Names are grouped by dialect prefix ("vllm:", "sglang:") because nearly every line of a vLLM
    page starts with "vllm:" and sre tries an alternation branch by branch: grouping halves the
    cost. Counters match with or without `_total`. Comment lines (HELP, TYPE) are dropped: samples
    are read by name, so the type adds nothing.
    """
    branches = []
    for prefix in ("vllm:", "sglang:"):
        rests = sorted((s.removeprefix(prefix) for s in _STEMS if s.startswith(prefix)), key=len,
                       reverse=True)
        branches.append(re.escape(prefix) + "(?:" + "|".join(re.escape(r) for r in rests) + ")")
    return re.compile(r"\n((?:" + "|".join(branches) + r")(?:_total)?[{ \t][^\n]*)")


_KEEP = _keep_pattern()
_MAX_ERROR_CHARS = 200

_Series = list[tuple[Mapping[str, str], float]]
_Parsed = tuple[tuple[str, Mapping[str, str], float], ...]  # (name without _total, labels, value)


def prefilter(text: str) -> list[str]:
    """The sample lines of `text` that `parse_metrics` reads, in page order."""
    return _KEEP.findall("\n" + text)


class MetricsParser:
    """Parses the successive `/metrics` pages of ONE replica.

    It remembers the parsed samples of the previous page's kept lines, so a line that did not
    change (the ~1.2 KB `vllm:cache_config_info` line always, idle gauges often) skips
    prometheus-client's slow parser; memory is bounded by one page's kept lines. Not safe to share
    between concurrent callers; the scraper keeps one per replica.
    """

    __slots__ = ("_previous",)

    def __init__(self) -> None:
        self._previous: dict[str, _Parsed] = {}

    def parse(self, text: str) -> ReplicaMetrics:
        """Like `parse_metrics`, reusing the previous page's unchanged lines."""
        current: dict[str, _Parsed] = {}
        series: dict[str, _Series] = {}
        previous = self._previous
        for line in prefilter(text):
            if line in current:
                continue  # the same series twice; counting it twice would double the load
            parsed = previous.get(line)
            if parsed is None:
                parsed = _parse_line(line)
            current[line] = parsed
            for name, labels, value in parsed:
                series.setdefault(name, []).append((labels, value))
        self._previous = current
        return _to_metrics(series)


def parse_metrics(text: str) -> ReplicaMetrics:
    """Parse one `/metrics` page; see the module docstring for what is required and what is optional.

    Pure and thread-safe. Raises only `MetricsParseError`.
    """
    return MetricsParser().parse(text)


def _parse_line(line: str) -> _Parsed:
    """One sample line through prometheus-client's parser."""
    try:
        return tuple(
            (sample.name.removesuffix("_total"), sample.labels, float(sample.value))
            for family in text_string_to_metric_families(line)
            for sample in family.samples
        )
    except Exception as err:  # the parser raises ValueError, IndexError, TypeError... on bad input
        reason = str(err)[:_MAX_ERROR_CHARS] or type(err).__name__
        raise MetricsParseError(f"not valid Prometheus text: {reason}") from None


def _to_metrics(series: Mapping[str, _Series]) -> ReplicaMetrics:
    dialect: Dialect
    if any(n in series for n in _VLLM.running):
        names, dialect = _VLLM, "vllm"
    elif any(n in series for n in _SGLANG.running):
        names, dialect = _SGLANG, "sglang"
    else:
        raise MetricsParseError("no running-requests gauge (vllm:num_requests_running or "
                                "sglang:num_running_reqs)")
    running = _required(series, names.running, "running")
    waiting = _required(series, names.waiting, "waiting")
    kv = _required(series, names.kv_usage, "kv usage")

    if dialect == "vllm":
        block_size, engine_blocks = _cache_config(series.get(_CACHE_CONFIG, []))
        max_loras, running_adapters, waiting_adapters = _lora(series.get(_LORA_INFO, []))
    else:
        capacity = [v for _, v in series.get(_SGLANG_CAPACITY, []) if _valid(v)]
        block_size = 1 if capacity else None
        engine_blocks = {str(i): int(v) for i, v in enumerate(capacity)}
        max_loras, running_adapters, waiting_adapters = None, (), ()

    return ReplicaMetrics(
        running=_count(running, "running"),
        waiting=_count(waiting, "waiting"),
        kv_usage=_combine_kv(kv, engine_blocks),
        prefix_queries_tokens=_optional_sum(series, names.prefix_queries),
        prefix_hits_tokens=_optional_sum(series, names.prefix_hits),
        preemptions=_optional_sum(series, names.preemptions),
        block_size=block_size,
        num_gpu_blocks=sum(engine_blocks.values()) if engine_blocks else None,
        max_loras=max_loras,
        running_adapters=running_adapters,
        waiting_adapters=waiting_adapters,
        dialect=dialect,
    )


def _valid(value: float) -> bool:
    return math.isfinite(value) and value >= 0


def _required(series: Mapping[str, _Series], names: Iterable[str], what: str) -> _Series:
    for name in names:
        found = series.get(name)
        if found:
            bad = [v for _, v in found if not _valid(v)]
            if bad:
                raise MetricsParseError(f"{name}: invalid value {bad[0]!r}")
            return found
    raise MetricsParseError(f"no {what} gauge ({' or '.join(names)})")


def _count(found: _Series, what: str) -> int:
    total = sum(v for _, v in found)
    if not math.isfinite(total):
        raise MetricsParseError(f"{what}: sum over engines overflows")
    return round(total)


def _optional_sum(series: Mapping[str, _Series], names: Iterable[str]) -> int:
    for name in names:
        found = series.get(name)
        if found:
            total = sum(v for _, v in found if _valid(v))
            return round(total) if math.isfinite(total) else 0
    return 0


def _combine_kv(kv: _Series, engine_blocks: Mapping[str, int]) -> float:
    usage = [min(1.0, v) for _, v in kv]
    if len(usage) == 1:
        return usage[0]
    weights = [engine_blocks.get(labels.get("engine", ""), 0) for labels, _ in kv]
    if all(w > 0 for w in weights):
        return sum(w * u for w, u in zip(weights, usage, strict=True)) / sum(weights)
    return max(usage)


def _label_int(labels: Mapping[str, str], key: str) -> int | None:
    """An integer label such as `block_size="128"`; None for "None", "", garbage or <= 0."""
    text = labels.get(key, "")
    if not (0 < len(text) <= 18 and text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value > 0 else None


def _cache_config(found: _Series) -> tuple[int | None, dict[str, int]]:
    """(block size, engine -> num_gpu_blocks) from `vllm:cache_config_info`'s labels."""
    block_size: int | None = None
    engine_blocks: dict[str, int] = {}
    for labels, _ in found:
        size = _label_int(labels, "block_size")
        blocks = _label_int(labels, "num_gpu_blocks")
        if size is None or blocks is None:
            continue
        # Engines of one replica share the cache config; the first engine's block size stands.
        block_size = block_size or size
        engine_blocks[labels.get("engine", "")] = blocks
    return block_size, engine_blocks


def _adapter_list(text: str) -> list[str]:
    return [name for name in (part.strip() for part in text.split(",")) if name]


def _lora(found: _Series) -> tuple[int | None, tuple[str, ...], tuple[str, ...]]:
    """(max_loras, running, waiting) from the newest `vllm:lora_requests_info` series per engine.

    vLLM adds a series for every new combination of adapters and keeps the old ones; the value is
    the Unix time the combination was last seen, so the largest value is the current state.
    """
    newest: dict[str, tuple[float, Mapping[str, str]]] = {}
    for labels, value in found:
        if not math.isfinite(value):
            continue
        engine = labels.get("engine", "")
        if engine not in newest or value > newest[engine][0]:
            newest[engine] = (value, labels)
    max_loras: int | None = None
    running: dict[str, None] = {}  # ordered set: union over engines, replica's order kept
    waiting: dict[str, None] = {}
    for _, labels in newest.values():
        limit = _label_int(labels, "max_lora")
        if limit is not None:
            max_loras = max(max_loras or 0, limit)
        running.update(dict.fromkeys(_adapter_list(labels.get("running_lora_adapters", ""))))
        waiting.update(dict.fromkeys(_adapter_list(labels.get("waiting_lora_adapters", ""))))
    return max_loras, tuple(running), tuple(waiting)
