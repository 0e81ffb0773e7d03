"""Rendering deploy/helm/kvgate with Helm's own engine, and what the tests read out of the result.

The renderer is helm-python-sdk: Helm v4's Go SDK (template engine, values coalescing, schema check)
built as a C library and called through ctypes, installed from PyPI like any test dependency, so no
`helm` binary has to be downloaded. No cluster is contacted (`lookup` returns nothing).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "kvgate"
ALL_ON = CHART / "ci" / "all-on-values.yaml"
RELEASE = "kvgate"
NAMESPACE = "llm-gateway"


@functools.cache
def _chart() -> Any:
    import helm_python

    return helm_python.Chart.load(str(CHART))


def values_file(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def render(values: dict[str, Any] | None = None, release: str = RELEASE) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders for `values` (NOTES.txt left out)."""
    manifests = _chart().render(values or {}, name=release, namespace=NAMESPACE, is_install=True)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(d for d in yaml.safe_load_all(text) if d)
    return objects


def render_notes(values: dict[str, Any] | None = None) -> str:
    manifests = _chart().render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    notes: str = next(t for p, t in manifests.items() if p.endswith("NOTES.txt"))
    return notes


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def kinds(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def kvgate_config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The kvgate.yaml the ConfigMap carries, as YAML data."""
    data = yaml.safe_load(one(objects, "ConfigMap")["data"]["kvgate.yaml"])
    assert isinstance(data, dict)
    return data


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert isinstance(c, dict)
    return c


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec
