from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

import loadtests.results as results_module
from loadtests.measures import FleetDelta, LoadgenUsage, RequestTrace, summarize
from loadtests.results import (
    RECORD_SCHEMA,
    RESULTS_SCHEMA,
    ResultsSchemaError,
    RunRecord,
    load_results,
    make_meta,
    make_record,
    schema_errors,
    validate_record,
    validate_results,
    write_results,
)
from loadtests.slo import Slo

REQUIRED_BY_ISSUE = (
    "policy", "workload", "concurrency", "rate", "requests", "duration_s", "ttft_p50_s", "ttft_p90_s",
    "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "itl_p50_s", "itl_p90_s", "itl_p99_s",
    "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "output_tok_s", "requests_s", "goodput_rps", "goodput_tok_s",
    "prefix_hit_rate", "preemptions", "errors", "status_429", "status_503", "per_tenant",
    "loadgen_cpu_frac", "loadgen_bottleneck",
)  # fmt: skip


def trace(
    rid: str, tenant: str | None, start: float, chunks: tuple[float, ...], status: int = 200
) -> RequestTrace:
    return RequestTrace(
        request_id=rid, tenant=tenant, group=None, start=start, first_token=chunks[0] if chunks else None,
        end=chunks[-1] if chunks else start + 0.1, chunk_times=list(chunks), output_tokens=len(chunks),
        prompt_tokens=10, cached_tokens=4, status=status, error=None if status == 200 else f"http: {status}",
    )  # fmt: skip


def a_record(**kwargs: Any) -> RunRecord:
    traces = [
        trace("a", "t1", 0.0, (0.5, 0.6, 0.7)),
        trace("b", "t2", 0.1, (0.4, 0.9)),
        trace("c", "t1", 0.2, (), status=429),
    ]
    args: dict[str, Any] = dict(
        policy="round-robin",
        workload="shared-prefix",
        measures=summarize(traces, warmup_end=0.0, slo=Slo(ttft_s=0.45)),
        loadgen=LoadgenUsage(cpu_s=0.2, wall_s=1.0, requests=3),
        concurrency=4,
        fleet=FleetDelta(prefix_queries=1000, prefix_hits=250, preemptions=3),
    )
    args.update(kwargs)
    return make_record(**args)


def test_a_produced_record_validates_and_holds_the_measures() -> None:
    record = a_record()
    validate_record(record.as_dict())
    d = record.as_dict()
    assert all(name in d for name in REQUIRED_BY_ISSUE)
    assert d["mode"] == "closed" and d["concurrency"] == 4 and d["rate"] is None and d["burstiness"] is None
    assert d["requests"] == 3 and d["completed"] == 2 and d["errors"] == 1 and d["status_429"] == 1
    assert d["prefix_hit_rate"] == 0.25 and d["preemptions"] == 3
    assert d["goodput_rps"] == pytest.approx(1 / 0.9)  # only b's TTFT (0.3) is within 0.45 s
    assert d["per_tenant"]["t1"]["requests"] == 2 and d["loadgen_cpu_frac"] == pytest.approx(0.2)
    assert d["loadgen_bottleneck"] is False


def test_open_loop_record_without_fleet_scrape() -> None:
    d = a_record(concurrency=None, rate=12.5, burstiness=0.5, fleet=None).as_dict()
    validate_record(d)
    assert d["mode"] == "open" and d["rate"] == 12.5 and d["burstiness"] == 0.5
    assert d["prefix_hit_rate"] is None and d["preemptions"] is None


def test_make_record_needs_exactly_one_load() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        a_record(rate=1.0)
    with pytest.raises(ValueError, match="exactly one"):
        a_record(concurrency=None)


@pytest.mark.parametrize("field", ["policy", "ttft_p90_s", "goodput_rps", "per_tenant", "loadgen_bottleneck"])
def test_a_record_missing_a_field_fails(field: str) -> None:
    d = a_record().as_dict()
    del d[field]
    with pytest.raises(ResultsSchemaError, match=f"missing field '{field}'"):
        validate_record(d)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("ttft_p90_s", "0.5", "expected number or null"),
        ("errors", 1.5, "expected integer"),
        ("errors", True, "expected integer"),  # a bool is not a count
        ("output_tok_s", float("nan"), "expected number"),
        ("prefix_hit_rate", 1.5, "above the maximum"),
        ("status_429", -1, "below the minimum"),
        ("mode", "sideways", "is not one of"),
        ("loadgen_bottleneck", 0, "expected boolean"),
        ("per_tenant", {"t": {"requests": 1}}, "missing field 'served_share'"),
        ("error_kinds", {"http": "2"}, "expected integer"),
    ],
)
def test_wrong_values_fail_with_the_path(field: str, value: Any, reason: str) -> None:
    d = a_record().as_dict()
    d[field] = value
    errors = schema_errors(d, RECORD_SCHEMA)
    assert errors and any(e.startswith(f"$.{field}") and reason in e for e in errors), errors


def test_every_record_field_is_in_the_schema_and_documented() -> None:
    names = [f.name for f in dataclasses.fields(RunRecord)]
    assert set(names) == set(RECORD_SCHEMA["properties"]) == set(RECORD_SCHEMA["required"])
    doc = results_module.__doc__ or ""
    assert all(name in doc for name in names)


def test_write_and_load_round_trip(tmp_path: Path) -> None:
    meta = make_meta(
        command="kvgate bench --preset quick", slo=Slo(ttft_s=1.0, tpot_s=0.05), simulator_profile="tiny",
        time_scale=10.0, fleet_size=4, kvgate_commit="abc123",
        started_at=datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        workloads={"random": {"seed": 0}},
    )  # fmt: skip
    path = tmp_path / "out" / "results.json"
    write_results(path, meta, [a_record(), a_record(policy="least-loaded").as_dict()])
    doc = load_results(path)
    assert doc["meta"]["started_at"] == "2026-01-02T03:04:05+00:00"
    assert doc["meta"]["slo"] == {"ttft_s": 1.0, "tpot_s": 0.05} and doc["meta"]["workloads"]
    assert [r["policy"] for r in doc["runs"]] == ["round-robin", "least-loaded"]
    assert doc["runs"][0] == a_record().as_dict()


def test_a_rewrite_replaces_the_file_whole(tmp_path: Path) -> None:
    # The bench rewrites results.json after every load point while others poll it (the interrupt
    # test, a user's watch): a reader holding the file must keep a whole document, never see it cut.
    path = tmp_path / "results.json"
    meta = make_meta(command="x", slo=None)
    write_results(path, meta, [a_record()])
    with path.open("rb") as reader:
        write_results(path, meta, [a_record(), a_record(policy="least-loaded")])
        held = orjson.loads(reader.read())
    assert [r["policy"] for r in held["runs"]] == ["round-robin"]
    assert [r["policy"] for r in load_results(path)["runs"]] == ["round-robin", "least-loaded"]
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temporary file left


def test_invalid_documents_are_not_written(tmp_path: Path) -> None:
    bad = a_record().as_dict()
    del bad["workload"]
    with pytest.raises(ResultsSchemaError):
        write_results(tmp_path / "r.json", make_meta(command="x", slo=None), [bad])
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    "doc",
    [
        {"runs": []},
        {"meta": {}, "runs": []},
        {"meta": make_meta(command="x", slo=None), "runs": {}},
        {"meta": make_meta(command="x", slo=None), "runs": [], "extra": 1},
        {"meta": {**make_meta(command="x", slo=None), "slo": {"ttft": 1}}, "runs": []},
    ],
)
def test_invalid_documents(doc: dict[str, Any]) -> None:
    with pytest.raises(ResultsSchemaError):
        validate_results(doc)


def test_schema_is_plain_json_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(RESULTS_SCHEMA)
    doc = {"meta": make_meta(command="x", slo=None), "runs": [a_record().as_dict()]}
    jsonschema.validate(doc, RESULTS_SCHEMA)
