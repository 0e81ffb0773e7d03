"""The dashboard's and the alert rules' PromQL against a real Prometheus scraping a live kvgate.

A `kvgate sim` fleet, a `kvgate serve` in front of it (one tenant with a small request limit and a pool
of one slot per replica, so traffic makes 429s and queue waits), traffic, then Prometheus (Debian's
package) scraping kvgate every second with the alert rules loaded. Through Prometheus's HTTP API:
every panel query, variable query and rule expression parses; every rule evaluates without error;
every metric name they use is one kvgate's /metrics declares (FUTURE_METRICS aside); and every panel
query over series kvgate has samples of returns data for real label values, so a misspelt label
name cannot hide behind a match-anything regex. `promtool check rules` and `promtool test rules`
(the same package) check the rule file and its unit tests.

Without `prometheus` and `promtool` on PATH these tests are skipped (tests/conftest.py), except in CI.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
import yaml

from loadtests.ports import free_port

from .monitoring import (
    ALERT_TESTS,
    ALERTS,
    FUTURE_METRICS,
    alert_rules,
    dashboard_targets,
    exposed_series,
    metric_names,
    substitute,
    variable_queries,
)

MODEL = "tiny-llama"  # the sim's `tiny` profile
TENANT = "team-a"
API_KEY = "kvgate-test-key"
JOB = "kvgate"
# Real label values of the traffic below, for the "returns data" check; ".*" for the parse check.
REAL = {"job": JOB, "model": MODEL, "tenant": TENANT, "band": "standard"}
ANY = dict.fromkeys(REAL, ".*")


def wait_until(what: str, check: Any, timeout: float, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except (httpx.HTTPError, OSError):
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(interval)


class Processes:
    """Child processes, stopped in reverse order (SIGTERM, then SIGKILL) whatever happens."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[tuple[subprocess.Popen[Any], IO[bytes]]] = []

    def start(self, name: str, args: list[str], stdout: Any = None) -> subprocess.Popen[Any]:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop()
        proc = subprocess.Popen(args, stdout=stdout or log, stderr=log, stdin=subprocess.DEVNULL)
        self.procs.append((proc, log))
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        for proc, _log in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, log in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()
            log.close()


@dataclass
class Live:
    prometheus: httpx.Client
    metrics_text: str  # kvgate's /metrics, read after the traffic

    def query(self, expr: str) -> dict[str, Any]:
        r = self.prometheus.get("/api/v1/query", params={"query": expr})
        body: dict[str, Any] = r.json()
        return body


def _traffic(base: str) -> None:
    """One tenant allowed 6 requests (then one a minute), on a pool that runs one request per replica.
    First the same long prompt twice in a row (the second is served from the replica's prefix
    cache), then six concurrent streams of distinct prompts: two start at once, two queue, two are
    refused (429)."""

    def one(prompt: str) -> int:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 16,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.Client(base_url=base, timeout=30) as c:
            r = c.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {API_KEY}"})
            return r.status_code

    shared = "You are a careful assistant for the kvgate monitoring test. " * 8
    assert [one(shared), one(shared)] == [200, 200]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        statuses = sorted(pool.map(one, [f"question {i}: " + "why? " * (20 + i) for i in range(6)]))
    assert statuses == [200] * 4 + [429] * 2, statuses


@pytest.fixture(scope="module")
def live(prometheus_package: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("prometheus-live")
    procs = Processes(tmp)
    try:
        sim = procs.start(
            "sim",
            [sys.executable, "-m", "gateway.cli", "sim", "--replicas", "2", "--port", "0",
             "--profile", "tiny", "--time-scale", "20"],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        assert sim.stdout is not None
        urls = [sim.stdout.readline().decode().strip() for _ in range(2)]
        assert all(u.startswith("http://") for u in urls), (urls, procs.log("sim"))

        port = free_port()
        config = {
            "server": {"host": "127.0.0.1", "port": port},
            "replicas": [{"url": u, "model": MODEL, "name": f"r{i}"} for i, u in enumerate(urls)],
            "fleet": {"scrape_interval_s": 0.1, "health_interval_s": 0.2},
            "tenants": [
                {
                    "name": TENANT,
                    "api_keys": ["sha256:" + hashlib.sha256(API_KEY.encode()).hexdigest()],
                    # Six requests, and no seventh within the test however slow the machine is.
                    "limits": {"rpm": 1, "rpm_burst": 6},
                }
            ],
            "flow_control": {"saturation": {"max_in_flight_per_replica": 1}},
        }
        (tmp / "kvgate.yaml").write_text(yaml.safe_dump(config))
        procs.start(
            "kvgate", [sys.executable, "-m", "gateway.cli", "serve", "--config", str(tmp / "kvgate.yaml")]
        )
        base = f"http://127.0.0.1:{port}"
        wait_until("kvgate /ready", lambda: httpx.get(f"{base}/ready", timeout=1).status_code == 200, 30)
        _traffic(base)
        metrics_text = httpx.get(f"{base}/metrics", timeout=5).text

        prom_port = free_port()
        (tmp / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(ALERTS)],
                    "scrape_configs": [
                        {"job_name": JOB, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                    ],
                }
            )
        )
        procs.start(
            "prometheus",
            [prometheus_package["prometheus"], f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}",
             "--log.level=warn"],
        )  # fmt: skip
        client = httpx.Client(base_url=f"http://127.0.0.1:{prom_port}", timeout=10)
        live = Live(client, metrics_text)
        wait_until("prometheus ready", lambda: client.get("/-/ready").status_code == 200, 30)
        # Two scrapes of kvgate (so rate() has data) and every rule evaluated at least once.
        wait_until(
            "two scrapes of kvgate",
            lambda: live.query(f'count_over_time(kvgate_requests_total{{job="{JOB}"}}[1m]) >= 2')["data"][
                "result"
            ],
            30,
        )

        def rules_evaluated() -> bool:
            groups = client.get("/api/v1/rules").json()["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            return bool(rules) and all(not r["lastEvaluation"].startswith("0001") for r in rules)

        wait_until("rules evaluated", rules_evaluated, 30)
        yield live
        client.close()
    except BaseException:
        for name in ("sim", "kvgate", "prometheus"):
            if (tmp / f"{name}.log").exists():
                sys.stderr.write(f"--- {name} log ---\n{procs.log(name)}\n")
        raise
    finally:
        procs.stop()


def _all_queries() -> list[tuple[str, str]]:
    """(where, PromQL with variables) of every panel target, variable selector and rule."""
    return (
        [(f"panel {t!r}", e) for t, e in dashboard_targets()]
        + [(f"variable ${n}", e) for n, e, _label in variable_queries()]
        + [(f"alert {a}", e) for a, e in alert_rules()]
    )


def test_every_panel_variable_and_rule_query_parses_in_prometheus(live: Live) -> None:
    bad = []
    for where, expr in _all_queries():
        for values in (ANY, REAL):
            body = live.query(substitute(expr, values))
            if body["status"] != "success":
                bad.append(f"{where}: {body.get('errorType')}: {body.get('error')}")
    assert not bad, "\n".join(bad)


def test_every_alert_rule_evaluates_without_error(live: Live) -> None:
    groups = live.prometheus.get("/api/v1/rules").json()["data"]["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(rules) == {name for name, _ in alert_rules()}
    for name, rule in rules.items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))
        assert rule["state"] == "inactive", name  # a healthy fleet: no alert fires


def test_every_metric_name_used_is_one_kvgate_exports(live: Live) -> None:
    declared, _sampled = exposed_series(live.metrics_text)
    used: dict[str, set[str]] = {}
    for where, expr in _all_queries():
        for name in metric_names(substitute(expr, ANY)):
            used.setdefault(name, set()).add(where)
    unknown = {n: sorted(w) for n, w in used.items() if n not in declared and n not in FUTURE_METRICS}
    assert not unknown, f"not in kvgate's /metrics: {unknown}"
    landed = sorted(set(FUTURE_METRICS) & declared)
    assert not landed, (
        f"kvgate exports {landed} now: take them off FUTURE_METRICS (tests/deploy/monitoring.py)"
    )
    assert set(FUTURE_METRICS) <= set(used)


def test_panels_over_exported_series_show_data_for_real_label_values(live: Live) -> None:
    _declared, sampled = exposed_series(live.metrics_text)
    empty, checked = [], 0
    for title, expr in dashboard_targets():
        if not metric_names(expr) <= sampled:
            continue  # a series kvgate has not observed yet (no upstream error, say) or a future one
        checked += 1
        body = live.query(substitute(expr, REAL))
        if not body["data"]["result"]:
            empty.append(f"{title}: {substitute(expr, REAL)}")
    assert not empty, "no data for real label values:\n" + "\n".join(empty)
    assert checked >= 20


def test_the_traffic_shows_where_the_issue_wants_it(live: Live) -> None:
    def values(expr: str) -> dict[str, float]:
        result = live.query(expr)["data"]["result"]
        return {",".join(r["metric"].values()): float(r["value"][1]) for r in result}

    assert values(f'sum by (reason) (kvgate_rejections_total{{tenant="{TENANT}"}})') == {
        "rate_limit_requests": 2
    }
    assert values(f'sum by (band) (kvgate_queue_wait_seconds_count{{tenant="{TENANT}"}})')["standard"] >= 1
    assert values(f'sum by (kind) (kvgate_tokens_total{{tenant="{TENANT}",kind="cached"}})')["cached"] > 0
    assert values("min by (replica) (kvgate_replica_healthy)") == {"r0": 1, "r1": 1}


def test_dashboard_variables_list_the_live_label_values(live: Live) -> None:
    for name, selector, label in variable_queries():
        result = live.query(substitute(selector, {**ANY, "job": JOB}))["data"]["result"]
        found = {r["metric"].get(label) for r in result}
        assert REAL[name] in found, (name, found)


def test_promtool_checks_the_rule_file(prometheus_package: dict[str, str]) -> None:
    out = subprocess.run(
        [prometheus_package["promtool"], "check", "rules", str(ALERTS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in out.stdout


def test_promtool_unit_tests_of_the_alert_rules(prometheus_package: dict[str, str]) -> None:
    # Each alert fires on the series written for it and stays silent on healthy ones (the file says how).
    out = subprocess.run(
        [prometheus_package["promtool"], "test", "rules", ALERT_TESTS.name],
        cwd=ALERT_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TZ": "UTC"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
    names = {
        t["alertname"]
        for group in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
        for t in group.get("alert_rule_test", [])
        if t.get("exp_alerts")
    }
    assert names == {a for a, _ in alert_rules()}, "every alert has a case where it fires"
