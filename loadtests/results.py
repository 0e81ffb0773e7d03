"""Benchmark results: one record per policy x workload x load point, `results.json`, and its schema.

`results.json` is `{"meta": {...}, "runs": [record, ...]}`.

`meta` (object; more keys allowed, e.g. `workloads` with each workload's `describe()`):
    started_at (str, ISO 8601 UTC), command (str, the command line), kvgate_commit (str | null),
    simulator_profile (str | null), time_scale (number | null: simulated durations are stretched by
    this factor), fleet_size (int | null, replicas), slo (object: the thresholds set, `ttft_s`, `tpot_s`,
    `e2e_s`, `itl_s`, seconds).

A record (`RunRecord`; every field below is present, null where the unit says "| null"):
    policy (str) routing policy, e.g. `round-robin`, `direct`;
    workload (str) workload type name, e.g. `shared-prefix`;
    mode (str) `closed` (fixed concurrency) or `open` (arrivals at a rate);
    concurrency (int | null) closed loop: requests in flight;
    rate (number | null) open loop: offered requests per second;
    burstiness (number | null) open loop: gamma shape of inter-arrival times, 1 = Poisson, < 1 burstier;
    warmup_s (number) seconds at the start whose requests are not measured;
    requests (int) measured requests, failed included; completed (int) successful ones;
    incomplete (int) requests still running at the drain deadline, cancelled and not measured;
    duration_s (number) seconds of the measured window;
    ttft_p50_s, ttft_p90_s, ttft_p99_s (number | null) time to first token, seconds;
    tpot_p50_s, tpot_p90_s, tpot_p99_s (number | null) time per output token after the first, seconds;
    itl_p50_s, itl_p90_s, itl_p99_s (number | null) gap between content chunks, seconds;
    e2e_p50_s, e2e_p90_s, e2e_p99_s (number | null) end-to-end latency, seconds;
    output_tok_s (number) output tokens per second of successful requests;
    requests_s (number) successful requests per second;
    goodput_rps (number) requests per second that met every SLO threshold;
    goodput_tok_s (number) output tokens per second of those requests;
    prefix_hit_rate (number | null) fleet prefix cache hits / queries over the run, tokens, 0-1;
    cached_token_fraction (number | null) sum of usage cached_tokens / prompt_tokens, 0-1;
    preemptions (int | null) fleet preemptions during the run (counter increase);
    errors (int) failed measured requests; status_429, status_503 (int) of which with that status;
    error_kinds (object: kind -> int) failures by kind (http, stream-error, connection, timeout,
    incomplete);
    per_tenant (object: tenant -> object) per-tenant measures, `{}` without tenants: requests,
    completed, errors, status_429 (int); ttft_p50_s, ttft_p90_s, ttft_p95_s, ttft_p99_s, e2e_p90_s
    (number | null, seconds); output_tok_s, goodput_rps (number, per second); offered_share (share of
    requests), served_share (share of successful output tokens) (number, 0-1);
    loadgen_cpu_frac (number) load generator CPU seconds per wall second, 1.0 = one core;
    loadgen_cpu_ms_per_request (number) its CPU milliseconds per request sent;
    loadgen_bottleneck (bool) loadgen_cpu_frac above 0.8: the generator may have set the pace.

Rates divide by `duration_s`. Percentiles interpolate linearly (see `loadtests.measures`).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gateway.atomic_file import write_atomic
from loadtests.measures import FleetDelta, LoadgenUsage, Measures
from loadtests.slo import Slo


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One policy x workload x load point; fields and units in the module docstring."""

    policy: str
    workload: str
    mode: str
    concurrency: int | None
    rate: float | None
    burstiness: float | None
    warmup_s: float
    requests: int
    completed: int
    incomplete: int
    duration_s: float
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p90_s: float | None
    tpot_p99_s: float | None
    itl_p50_s: float | None
    itl_p90_s: float | None
    itl_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p90_s: float | None
    e2e_p99_s: float | None
    output_tok_s: float
    requests_s: float
    goodput_rps: float
    goodput_tok_s: float
    prefix_hit_rate: float | None
    cached_token_fraction: float | None
    preemptions: int | None
    errors: int
    status_429: int
    status_503: int
    error_kinds: dict[str, int]
    per_tenant: dict[str, dict[str, Any]]
    loadgen_cpu_frac: float
    loadgen_cpu_ms_per_request: float
    loadgen_bottleneck: bool

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def make_record(
    *,
    policy: str,
    workload: str,
    measures: Measures,
    loadgen: LoadgenUsage,
    concurrency: int | None = None,
    rate: float | None = None,
    burstiness: float | None = None,
    warmup_s: float = 0.0,
    incomplete: int = 0,
    fleet: FleetDelta | None = None,
) -> RunRecord:
    """A record from a run's measures. Exactly one of `concurrency` (closed loop) and `rate` (open
    loop, requests/s) is given. `fleet` is the counter increase over the run (None when the fleet's
    `/metrics` were not scraped: hit rate and preemptions are then null)."""
    if (concurrency is None) == (rate is None):
        raise ValueError("give exactly one of concurrency (closed loop) and rate (open loop)")
    m = measures
    return RunRecord(
        policy=policy,
        workload=workload,
        mode="closed" if concurrency is not None else "open",
        concurrency=concurrency,
        rate=rate,
        burstiness=burstiness if rate is not None else None,
        warmup_s=warmup_s,
        requests=m.requests,
        completed=m.completed,
        incomplete=incomplete,
        duration_s=m.duration_s,
        ttft_p50_s=m.ttft.p50,
        ttft_p90_s=m.ttft.p90,
        ttft_p99_s=m.ttft.p99,
        tpot_p50_s=m.tpot.p50,
        tpot_p90_s=m.tpot.p90,
        tpot_p99_s=m.tpot.p99,
        itl_p50_s=m.itl.p50,
        itl_p90_s=m.itl.p90,
        itl_p99_s=m.itl.p99,
        e2e_p50_s=m.e2e.p50,
        e2e_p90_s=m.e2e.p90,
        e2e_p99_s=m.e2e.p99,
        output_tok_s=m.output_tok_s,
        requests_s=m.requests_s,
        goodput_rps=m.goodput_rps,
        goodput_tok_s=m.goodput_tok_s,
        prefix_hit_rate=fleet.prefix_hit_rate if fleet is not None else None,
        cached_token_fraction=m.cached_token_fraction,
        preemptions=round(fleet.preemptions) if fleet is not None else None,
        errors=m.errors,
        status_429=m.status_429,
        status_503=m.status_503,
        error_kinds=dict(m.error_kinds),
        per_tenant={name: tm.as_dict() for name, tm in m.per_tenant.items()},
        loadgen_cpu_frac=loadgen.cpu_frac,
        loadgen_cpu_ms_per_request=loadgen.cpu_ms_per_request,
        loadgen_bottleneck=loadgen.bottleneck,
    )


def make_meta(
    *,
    command: str,
    slo: Slo | None,
    simulator_profile: str | None = None,
    time_scale: float | None = None,
    fleet_size: int | None = None,
    kvgate_commit: str | None = None,
    started_at: datetime.datetime | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The `meta` object; `extra` keys (e.g. `workloads`) are kept as given (JSON-serializable)."""
    when = started_at or datetime.datetime.now(datetime.UTC)
    return {
        "started_at": when.astimezone(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "kvgate_commit": kvgate_commit,
        "simulator_profile": simulator_profile,
        "time_scale": time_scale,
        "fleet_size": fleet_size,
        "slo": slo.as_dict() if slo is not None else {},
        **extra,
    }


# --- schema ---------------------------------------------------------------------------------------

_NUM = "number"
_NUM_OR_NULL = ["number", "null"]
_INT = {"type": "integer", "minimum": 0}
_RATE = {"type": "number", "minimum": 0}
_SECONDS_OR_NULL = {"type": _NUM_OR_NULL, "minimum": 0}
_FRACTION_OR_NULL = {"type": _NUM_OR_NULL, "minimum": 0, "maximum": 1}

TENANT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "requests": _INT,
        "completed": _INT,
        "errors": _INT,
        "status_429": _INT,
        "ttft_p50_s": _SECONDS_OR_NULL,
        "ttft_p90_s": _SECONDS_OR_NULL,
        "ttft_p95_s": _SECONDS_OR_NULL,
        "ttft_p99_s": _SECONDS_OR_NULL,
        "e2e_p90_s": _SECONDS_OR_NULL,
        "output_tok_s": _RATE,
        "goodput_rps": _RATE,
        "offered_share": {"type": _NUM, "minimum": 0, "maximum": 1},
        "served_share": {"type": _NUM, "minimum": 0, "maximum": 1},
    },
    "additionalProperties": True,
}
TENANT_SCHEMA["required"] = list(TENANT_SCHEMA["properties"])

RECORD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "policy": {"type": "string", "minLength": 1},
        "workload": {"type": "string", "minLength": 1},
        "mode": {"enum": ["closed", "open"]},
        "concurrency": {"type": ["integer", "null"], "minimum": 1},
        "rate": {"type": _NUM_OR_NULL, "minimum": 0},
        "burstiness": {"type": _NUM_OR_NULL, "minimum": 0},
        "warmup_s": {"type": _NUM, "minimum": 0},
        "requests": _INT,
        "completed": _INT,
        "incomplete": _INT,
        "duration_s": {"type": _NUM, "minimum": 0},
        **{f"{m}_p{q}_s": _SECONDS_OR_NULL for m in ("ttft", "tpot", "itl", "e2e") for q in (50, 90, 99)},
        "output_tok_s": _RATE,
        "requests_s": _RATE,
        "goodput_rps": _RATE,
        "goodput_tok_s": _RATE,
        "prefix_hit_rate": _FRACTION_OR_NULL,
        "cached_token_fraction": _FRACTION_OR_NULL,
        "preemptions": {"type": ["integer", "null"], "minimum": 0},
        "errors": _INT,
        "status_429": _INT,
        "status_503": _INT,
        "error_kinds": {"type": "object", "additionalProperties": _INT},
        "per_tenant": {"type": "object", "additionalProperties": TENANT_SCHEMA},
        "loadgen_cpu_frac": {"type": _NUM, "minimum": 0},
        "loadgen_cpu_ms_per_request": {"type": _NUM, "minimum": 0},
        "loadgen_bottleneck": {"type": "boolean"},
    },
    "additionalProperties": True,
}
RECORD_SCHEMA["required"] = list(RECORD_SCHEMA["properties"])

META_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "started_at": {"type": "string", "minLength": 1},
        "command": {"type": "string"},
        "kvgate_commit": {"type": ["string", "null"]},
        "simulator_profile": {"type": ["string", "null"]},
        "time_scale": {"type": _NUM_OR_NULL, "minimum": 0},
        "fleet_size": {"type": ["integer", "null"], "minimum": 1},
        "slo": {
            "type": "object",
            "properties": {k: {"type": _NUM, "minimum": 0} for k in ("ttft_s", "tpot_s", "e2e_s", "itl_s")},
            "additionalProperties": False,
        },
    },
    "additionalProperties": True,
}
META_SCHEMA["required"] = list(META_SCHEMA["properties"])

RESULTS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "kvgate benchmark results",
    "type": "object",
    "required": ["meta", "runs"],
    "properties": {"meta": META_SCHEMA, "runs": {"type": "array", "items": RECORD_SCHEMA}},
    "additionalProperties": False,
}


class ResultsSchemaError(ValueError):
    """A results document that does not match `RESULTS_SCHEMA`; `errors` lists every violation."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("results do not match the schema: " + "; ".join(errors))
        self.errors = list(errors)


def schema_errors(instance: Any, schema: Mapping[str, Any], path: str = "$") -> list[str]:
    """Violations of `schema` by `instance`, each as `<path>: <reason>`. Supports the keywords these
    schemas use: type, enum, required, properties, additionalProperties, items, minimum, maximum,
    minLength. Booleans are not numbers; NaN and infinities are not valid numbers (JSON has none)."""
    errors: list[str] = []
    _check(instance, schema, path, errors)
    return errors


def validate_record(record: Mapping[str, Any]) -> None:
    """Raise `ResultsSchemaError` unless `record` is a valid run record."""
    errors = schema_errors(record, RECORD_SCHEMA)
    if errors:
        raise ResultsSchemaError(errors)


def validate_results(doc: Any) -> None:
    """Raise `ResultsSchemaError` unless `doc` is a valid results document."""
    errors = schema_errors(doc, RESULTS_SCHEMA)
    if errors:
        raise ResultsSchemaError(errors)


def write_results(
    path: Path, meta: Mapping[str, Any], records: Sequence[RunRecord | Mapping[str, Any]]
) -> None:
    """Validate and write `results.json` at `path` (parent directories created). The file is replaced
    whole: a reader polling it while a bench runs never sees it half-written, and an interrupted write
    keeps the previous records."""
    runs = [r.as_dict() if isinstance(r, RunRecord) else dict(r) for r in records]
    doc = {"meta": dict(meta), "runs": runs}
    validate_results(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")


def load_results(path: Path) -> dict[str, Any]:
    """Read and validate a results file."""
    doc = orjson.loads(path.read_bytes())
    validate_results(doc)
    result: dict[str, Any] = doc
    return result


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list, tuple),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
    "null": (type(None),),
}


def _is_type(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    if name == "number" and isinstance(value, float) and not math.isfinite(value):
        return False
    return isinstance(value, _TYPES[name])


def _check(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
        return
    if "type" in schema:
        names = [schema["type"]] if isinstance(schema["type"], str) else list(schema["type"])
        if not any(_is_type(value, n) for n in names):
            errors.append(f"{path}: expected {' or '.join(names)}, got {type(value).__name__} {value!r:.60}")
            return
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} is above the maximum {schema['maximum']}")
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        errors.append(f"{path}: string shorter than {schema['minLength']}")
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                errors.append(f"{path}: missing field {key!r}")
        props: Mapping[str, Any] = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                _check(item, props[key], f"{path}.{key}", errors)
            elif extra is False:
                errors.append(f"{path}: unexpected field {key!r}")
            elif isinstance(extra, Mapping):
                _check(item, extra, f"{path}.{key}", errors)
    if isinstance(value, (list, tuple)) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{i}]", errors)
