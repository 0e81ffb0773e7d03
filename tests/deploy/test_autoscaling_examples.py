"""The autoscaling examples in deploy/autoscaling/: the HPA is valid Kubernetes, the KEDA object
has the shape KEDA reads, and every query names only metrics kvgate exports (the goodput headroom)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.pool_headroom import RATIO_METRIC, RPS_METRIC, TPS_METRIC

from .monitoring import metric_names

DIR = Path(__file__).resolve().parents[2] / "deploy" / "autoscaling"
EXPORTED = {RATIO_METRIC, RPS_METRIC, TPS_METRIC}


def load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((DIR / name).read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("kube", ["1.25.0", "1.37.0"])
def test_the_hpa_is_valid_kubernetes(kube: str) -> None:
    import kubernetes_validate

    hpa = load("prometheus-adapter-hpa.yaml")
    kubernetes_validate.validate(hpa, kube, strict=True)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["target"] == {"type": "Value", "value": "800m"}


def test_the_adapter_rule_and_the_keda_query_read_the_headroom_ratio() -> None:
    text = (DIR / "prometheus-adapter-hpa.yaml").read_text()
    rule = re.search(r"metricsQuery: '(.+)'", text)
    assert rule is not None
    assert metric_names(rule.group(1).replace("<<.LabelMatchers>>", 'pool="x"')) == {RATIO_METRIC}
    keda = load("keda-scaledobject.yaml")
    assert keda["kind"] == "ScaledObject" and keda["apiVersion"] == "keda.sh/v1alpha1"
    (trigger,) = keda["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    assert metric_names(trigger["metadata"]["query"]) <= EXPORTED
    assert 0 < float(trigger["metadata"]["threshold"]) <= 1
