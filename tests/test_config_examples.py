"""Every example config in config/ loads, passes the semantic checks, and says something real."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config_check import check_semantics, load_checked

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "config").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_loads(path: Path) -> None:
    config = load_checked(path)  # what every kvgate command does with it
    assert config.replicas or config.discovery.configured or config.simulator.replicas >= 1


def test_kubernetes_configmap_holds_a_valid_config() -> None:
    import yaml

    from gateway.config import parse_config

    manifest = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes" / "kvgate.yaml"
    docs = list(yaml.safe_load_all(manifest.read_text()))
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    config = parse_config(yaml.safe_load(configmap["data"]["kvgate.yaml"]))
    check_semantics(config)
    assert config.discovery.kubernetes is not None and config.state.store.startswith("redis://")


def test_kubernetes_manifest_is_valid_and_grants_discovery_list_and_watch() -> None:
    """Every object validates against the Kubernetes schemas (strict); the Role lets the Deployment's
    service account list and watch EndpointSlices and pods in the discovered namespace."""
    import kubernetes_validate
    import yaml

    manifest = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes" / "kvgate.yaml"
    docs = list(yaml.safe_load_all(manifest.read_text()))
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    by_kind = {d["kind"]: d for d in docs}
    config = yaml.safe_load(by_kind["ConfigMap"]["data"]["kvgate.yaml"])
    namespace = config["discovery"]["kubernetes"]["namespace"]
    role, binding = by_kind["Role"], by_kind["RoleBinding"]
    assert role["metadata"]["namespace"] == namespace == binding["metadata"]["namespace"]
    grants = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert grants[("discovery.k8s.io", "endpointslices")] >= {"list", "watch"}
    assert grants[("", "pods")] >= {"list", "watch"}
    account = by_kind["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert {"kind": "ServiceAccount", "name": account, "namespace": "default"} in binding["subjects"]
