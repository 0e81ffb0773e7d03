"""The monitoring files (deploy/grafana, deploy/prometheus) as data, and the PromQL the tests read.

`metric_names` takes the metric names out of a PromQL expression; `exposed_series` says which series
names a /metrics page gives Prometheus (a histogram `h` gives `h_bucket`, `h_sum` and `h_count`, not
`h`; a counter is exposed under its `_total` name), so a query naming a series kvgate does not export
— a misspelt name, or `_bucket` on a counter — is caught.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "kvgate-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "kvgate-alerts.yaml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "kvgate-alerts.test.yaml"

# Metric names the dashboard and the rules use before kvgate exports them: features being built
# alongside. Keep this tiny; the live test fails once kvgate exports one of them, so it
# is taken off here at once (and from then on checked like any other name).
FUTURE_METRICS: dict[str, str] = {}

# Grafana's built-in interval variables, as Grafana would fill them for a short range.
GRAFANA_INTERVALS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_targets() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of every panel."""
    return [(p["title"], t["expr"]) for p in panels() for t in p.get("targets", [])]


def variables() -> list[dict[str, Any]]:
    return list(dashboard()["templating"]["list"])


_LABEL_VALUES = re.compile(r"^label_values\((?P<expr>.*),\s*(?P<label>[a-zA-Z_]\w*)\s*\)$", re.S)


def variable_queries() -> list[tuple[str, str, str]]:
    """(variable, PromQL selector, label) of every `label_values(selector, label)` query variable."""
    out = []
    for v in variables():
        if v["type"] != "query":
            continue
        query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = _LABEL_VALUES.match(query.strip())
        assert m, f"variable {v['name']}: only label_values(selector, label) queries are checked: {query}"
        out.append((v["name"], m["expr"], m["label"]))
    return out


def alert_rules() -> list[tuple[str, str]]:
    """(alert name, PromQL) of every rule."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [(r.get("alert") or r["record"], r["expr"]) for g in groups for r in g["rules"]]


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's template variables filled in: `$name` and `${name}` from `values` (a variable the
    dashboard defines but `values` lacks is an error), the interval variables as Grafana would."""
    for name, value in GRAFANA_INTERVALS.items():
        expr = expr.replace(name, value)

    def one(m: re.Match[str]) -> str:
        name = m["braced"] or m["plain"]
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(?P<braced>\w+)\}|\$(?P<plain>[a-zA-Z_]\w*)", one, expr)


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.I)
_WORD = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: every bare identifier that is not a function or
    aggregation (followed by "("), a keyword, a label name (in {} or a by/on/... list) or part of a
    string, number or duration."""
    expr = _STRINGS.sub('""', expr)
    expr = _MATCHERS.sub(" ", expr)
    expr = _RANGES.sub(" ", expr)
    expr = _LABEL_LISTS.sub(" ", expr)
    names = set()
    for m in _WORD.finditer(expr):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def exposed_series(metrics_text: str) -> tuple[set[str], set[str]]:
    """(every series name the page declares, the names that have a sample now).

    Declared: from the # TYPE lines, with a histogram's and a summary's own series names, so a family
    whose children have not been observed yet (no error so far, say) still counts as exported."""
    declared: set[str] = set()
    sampled: set[str] = set()
    for line in metrics_text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            if kind == "histogram":
                declared |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            elif kind == "summary":
                declared |= {name, f"{name}_sum", f"{name}_count"}
            else:
                declared.add(name)
        elif line and not line.startswith("#"):
            sampled.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return declared | sampled, sampled
