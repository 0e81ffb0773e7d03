"""The answer's `model` field rewritten as bytes (gateway/forwarder `_rewriting`), and route overrides
as they travel between gateways (gateway/route_table)."""

from __future__ import annotations

import itertools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from gateway.config import parse_config
from gateway.forwarder import _rewriting
from gateway.metrics import ITL_BUCKETS
from gateway.model_resolver import Resolution
from gateway.route_metrics import Gaps
from gateway.route_table import RouteOverride, RouteTable
from gateway.sse_filter import SseFilter

BASE = "llama-3-8b"


def event(model: str, content: str) -> bytes:
    doc = {
        "id": "x",
        "object": "chat.completion.chunk",
        "model": model,
        "choices": [{"delta": {"content": content}}],
    }
    return b"data: " + orjson.dumps(doc) + b"\n\n"


STREAM = (
    event("chat-v2", "")
    + event("chat-v2", 'say "model":"chat-v2" here')  # inside a string: escaped, never matched
    + event("chat-v2", "ok")
    + b"data: [DONE]\n\n"
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, len(STREAM) - 1), max_size=6, unique=True))
def test_every_event_carries_the_clients_name_however_the_stream_is_split(cuts: list[int]) -> None:
    res = Resolution.build("chat", BASE, "chat-v2", route="chat")
    assert res.rewrite is not None and res.upstream_model == "chat-v2"
    feed = _rewriting(SseFilter(strip_usage=False).feed, *res.rewrite)
    bounds = [0, *sorted(cuts), len(STREAM)]
    out = b"".join(feed(STREAM[a:b]) for a, b in itertools.pairwise(bounds))
    docs = [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e.startswith(b"data: {")]
    assert [d["model"] for d in docs] == ["chat", "chat", "chat"]
    assert docs[1]["choices"][0]["delta"]["content"] == 'say "model":"chat-v2" here'
    assert out.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize(
    ("requested", "pool", "adapter", "rewrite", "upstream"),
    [
        (BASE, BASE, None, None, None),  # names equal: nothing to do, per request or per chunk
        ("chat-v2", BASE, "chat-v2", None, None),
        (
            f"{BASE}:chat-v2",
            BASE,
            "chat-v2",
            (b'"model":"chat-v2"', b'"model":"llama-3-8b:chat-v2"'),
            "chat-v2",
        ),
        ("chat", BASE, None, (b'"model":"llama-3-8b"', b'"model":"chat"'), BASE),
        ('we"ird', BASE, None, (b'"model":"llama-3-8b"', b'"model":"we\\"ird"'), BASE),  # JSON-escaped
    ],
)
def test_resolution_rewrites_only_when_the_names_differ(
    requested: str, pool: str, adapter: str | None, rewrite: tuple[bytes, bytes] | None, upstream: str | None
) -> None:
    res = Resolution.build(requested, pool, adapter)
    assert res.rewrite == rewrite and res.upstream_model == upstream
    assert (
        res.target == (pool if adapter is None else f"{pool}:{adapter}") and res.header == res.target.encode()
    )


CONFIG = {
    "models": [{"name": BASE}],
    "routes": [
        {
            "name": "chat",
            "targets": [{"model": BASE, "weight": 9}, {"model": f"{BASE}:v2", "weight": 1}],
            "tenant_targets": {"acme": [{"model": BASE, "weight": 1}, {"model": f"{BASE}:v2", "weight": 1}]},
        }
    ],
}


def test_an_override_survives_its_trip_through_the_store_and_is_applied_alike() -> None:
    table = RouteTable(parse_config(CONFIG))
    o = table.propose(
        "chat",
        {"weights": {BASE: 1, f"{BASE}:v2": 1}, "tenant_weights": {"acme": {BASE: 0, f"{BASE}:v2": 1}}},
        None,
    )
    back = RouteOverride.decode(o.encode())
    assert back == o
    other = RouteTable(parse_config(CONFIG))  # another gateway with the same config
    assert other.apply("chat", back)
    assert other.routes["chat"].split.layout == table.routes["chat"].split.reweighted([1, 1]).layout
    assert other.routes["chat"].tenant_splits["acme"].counts() == (0, 10_000)
    assert other.apply("chat", None) and other.routes["chat"].split.weights == (9, 1)


def test_an_override_made_for_other_targets_or_garbage_is_not_applied() -> None:
    table = RouteTable(parse_config(CONFIG))
    o = table.propose("chat", {"weights": {BASE: 1, f"{BASE}:v2": 1}}, None)
    changed = dict(CONFIG, routes=[{**CONFIG["routes"][0], "targets": [{"model": BASE, "weight": 1}]}])  # type: ignore[index]
    other = RouteTable(parse_config(changed))
    assert not other.apply("chat", o) and other.routes["chat"].split.weights == (1,)
    assert not table.apply("nope", o)
    with pytest.raises(ValueError, match="not a route override"):
        RouteOverride.decode(b'{"targets": 3}')


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(ITL_BUCKETS), st.floats(0, 20, allow_nan=False)), max_size=50))
def test_the_routes_gap_histogram_counts_as_prometheus_does(gaps: list[float]) -> None:
    registry = CollectorRegistry()
    reference = Histogram("h", "h", buckets=ITL_BUCKETS, registry=registry)
    mine = Gaps()
    for g in gaps:
        reference.observe(g)
        mine.observe(g)
    samples = {
        s.labels.get("le"): s.value for s in next(iter(registry.collect())).samples if s.name == "h_bucket"
    }
    assert [(le, n) for le, n in mine.buckets()] == [(str(b), samples[str(b)]) for b in ITL_BUCKETS] + [
        ("+Inf", samples["+Inf"])
    ]
    assert mine.total == pytest.approx(sum(gaps))
