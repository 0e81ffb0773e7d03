"""The Grafana dashboard and the alert rules as files: well-formed, importable with a data source of
the importer's choosing, every template variable defined, and the PromQL reader the live test relies
on (tests/deploy/monitoring.py) reads names right. What the queries mean against a real Prometheus
and a real kvgate is test_prometheus.py's."""

from __future__ import annotations

import re

import pytest
import yaml

from .monitoring import (
    ALERTS,
    FUTURE_METRICS,
    alert_rules,
    dashboard,
    dashboard_targets,
    metric_names,
    panels,
    substitute,
    variable_queries,
    variables,
)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("kvgate_requests_total", {"kvgate_requests_total"}),
        (
            'sum by (model, status) (rate(kvgate_requests_total{job=~"$job",status=~"5.."}[5m]))',
            {"kvgate_requests_total"},
        ),
        (
            "histogram_quantile(0.99, sum by (model, le) (rate(kvgate_time_to_first_token_seconds_bucket"
            '{model=~"a|b"}[$__rate_interval])))',
            {"kvgate_time_to_first_token_seconds_bucket"},
        ),
        (
            'sum(rate(a_sum[1m])) by (job) / on (job) group_left (x) sum(rate(a_count{le="+Inf"}[1m]))',
            {"a_sum", "a_count"},
        ),
        ("time() - max by (instance) (kvgate_discovery_age_seconds) > 300", {
            "kvgate_discovery_age_seconds"
        }),
        ('label_replace(up, "dst", "$1", "src", "(.*)") offset 5m and bool nan', {"up"}),
        ("x:recorded:rate5m * 1e3 + -Inf", {"x:recorded:rate5m"}),
        ('count_over_time(m{a="sum(b)"}[1h:5m])', {"m"}),
    ],
)  # fmt: skip
def test_metric_names_are_read_out_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_substitute_fills_every_variable_or_says_which_is_missing() -> None:
    out = substitute('rate(x{job=~"$job",m=~"${model}"}[$__rate_interval])', {"job": "kvgate", "model": ".*"})
    assert out == 'rate(x{job=~"kvgate",m=~".*"}[1m])'
    with pytest.raises(KeyError, match=r"\$tenant"):
        substitute('x{tenant=~"$tenant"}', {})


def test_the_dashboard_imports_with_the_importers_data_source() -> None:
    d = dashboard()
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int)
    (ds,) = [v for v in variables() if v["type"] == "datasource"]
    assert ds["name"] == "datasource" and ds["query"] == "prometheus"
    expected = {"type": "prometheus", "uid": "${datasource}"}
    for p in panels():
        assert p["datasource"] == expected, p["title"]
        for t in p["targets"]:
            assert t["datasource"] == expected, p["title"]
    for v in variables():
        if v["type"] == "query":
            assert v["datasource"] == expected, v["name"]
    # No data source of the exporting Grafana left behind: nothing but the variable and the built-in.
    uids = set(re.findall(r'"uid":\s*"([^"]+)"', str(d).replace("'", '"')))
    assert uids <= {"${datasource}", "-- Grafana --", d["uid"]}


def test_every_template_variable_used_is_defined() -> None:
    defined = {v["name"] for v in variables()}
    for title, expr in dashboard_targets():
        substitute(expr, dict.fromkeys(defined, ".*"))  # raises on an undefined one
        assert "$" not in substitute(expr, dict.fromkeys(defined, ".*")), title
    for name, selector, _label in variable_queries():
        substitute(selector, dict.fromkeys(defined - {name}, ".*"))  # no variable refers to itself


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    all_panels = dashboard()["panels"]
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in all_panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
    for p in panels():
        assert p["title"] and p.get("description"), p["id"]
        assert [t["refId"] for t in p["targets"]] == [chr(65 + i) for i in range(len(p["targets"]))]


def test_the_dashboard_covers_what_issue_14_asks_for() -> None:
    used = {name for _title, expr in dashboard_targets() for name in metric_names(expr)}
    for name in (
        "kvgate_time_to_first_token_seconds_bucket",
        "kvgate_inter_chunk_latency_seconds_bucket",
        "kvgate_request_duration_seconds_bucket",
        "kvgate_tokens_total",  # prefix hit rate (cached / prompt) and tokens by tenant
        "kvgate_queue_wait_seconds_bucket",
        "kvgate_rejections_total",
        "kvgate_replica_healthy",
        "kvgate_prefix_index_mode",
    ):
        assert name in used, name
    (hit_rate,) = [e for t, e in dashboard_targets() if t.startswith("Prefix cache hit rate")]
    assert 'kind="cached"' in hit_rate and 'kind="prompt"' in hit_rate  # the replicas' own numbers
    (queue,) = [e for t, e in dashboard_targets() if t.startswith("Queue wait")]
    assert "by (tenant, band, le)" in queue


def test_the_alert_rules_cover_issue_14_and_are_annotated() -> None:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    rules = [r for g in groups for r in g["rules"]]
    names = {r["alert"] for r in rules}
    assert {
        "KvgateReplicaEjected",
        "KvgateDiscoveryStale",
        "Kvgate5xxRatioHigh",
        "KvgateQueueWaitHigh",
    } <= names
    for r in rules:
        assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        assert "for" in r, r["alert"]  # no alert on a single evaluation


def test_every_future_metric_is_used_and_its_panels_say_so() -> None:
    used = {n for _t, e in dashboard_targets() + alert_rules() for n in metric_names(e)}
    assert set(FUTURE_METRICS) <= used  # no dead entries
    assert len(FUTURE_METRICS) <= 2
    for p in panels():
        future = {n for t in p["targets"] for n in metric_names(t["expr"])} & set(FUTURE_METRICS)
        for name in future:  # a panel that stays empty for now tells the reader why
            assert name in p["description"] and "issue #14" in p["description"], p["title"]
