"""The Helm chart (deploy/helm/kvgate): rendered by Helm's own engine, every object valid against the
Kubernetes schemas, and the manifests agreeing with kvgate where they must — the config it loads, the
port, the probes of the drain, the grace period computed from the drain's own settings, discovery's
RBAC, the replica credentials.

Rendered with default values and with ci/all-on-values.yaml (every option on); validated with
kubernetes-validate's bundled OpenAPI schemas (offline) against the oldest Kubernetes the chart
supports and the newest the package knows, strict (unknown fields refused). The ServiceMonitor is a
Prometheus Operator CRD, which kubernetes-validate has no schema for: it is validated against the
operator's own types (cloudcoil-models-prometheus-operator, generated from its CRDs).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import Config, ServerConfig, parse_config
from gateway.config_check import check_semantics

from .chart import (
    ALL_ON,
    CHART,
    NAMESPACE,
    ROOT,
    container,
    kinds,
    kvgate_config,
    one,
    pod_spec,
    render,
    render_notes,
    values_file,
)

# Config keys the chart writes for gateway features being built alongside it (drain on SIGTERM,
# discovery). kvgate's strict config refuses keys it does not know, so while a key is missing from
# the config model the config test takes it out before loading — and only then: once the feature
# lands, the same test loads it for real. Keep this list to keys named in issue #14.
FUTURE_CONFIG_KEYS: tuple[tuple[str, ...], ...] = (
    ("server", "drain_propagation_s"),
    ("server", "drain_timeout_s"),
)

OLDEST_KUBERNETES = "1.25.0"  # Chart.yaml's kubeVersion floor
NEWEST_KUBERNETES = "1.37.0"

VALUE_SETS = {"default": None, "all-on": ALL_ON}


def values_for(name: str) -> dict[str, Any]:
    path = VALUE_SETS[name]
    return values_file(path) if path is not None else {}


def _known(path: tuple[str, ...]) -> bool:
    model: Any = Config
    for key in path:
        fields = getattr(model, "model_fields", None)
        if fields is None or key not in fields:
            return False
        model = fields[key].annotation
    return True


def load_like_kvgate(data: dict[str, Any]) -> Config:
    """What `kvgate serve` does with the file (schema, then semantics), less the FUTURE_CONFIG_KEYS
    this kvgate does not know yet."""
    data = yaml.safe_load(yaml.safe_dump(data))  # a copy
    for path in FUTURE_CONFIG_KEYS:
        if _known(path):
            continue
        parent = data
        for key in path[:-1]:
            parent = parent.get(key, {})
        parent.pop(path[-1], None)
    config = parse_config(data)
    check_semantics(config)
    return config


# --- rendering and schemas ---------------------------------------------------------------------


def test_the_chart_lints_clean() -> None:
    import helm_python

    for name in VALUE_SETS:
        report = helm_python.lint(str(CHART), values_for(name), strict=True)
        problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error
        assert not problems and not report["errors"], (name, report)


def test_what_each_value_set_renders() -> None:
    assert kinds(render()) == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "ServiceAccount"]
    assert kinds(render(values_for("all-on"))) == [
        "ConfigMap", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Service",
        "ServiceAccount", "ServiceMonitor",
    ]  # fmt: skip


@pytest.mark.parametrize("kube", [OLDEST_KUBERNETES, NEWEST_KUBERNETES])
@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_every_rendered_object_is_valid_kubernetes(value_set: str, kube: str) -> None:
    import kubernetes_validate

    objects = render(values_for(value_set))
    checked = 0
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            continue  # a CRD: test_the_service_monitor_is_valid_and_scrapes_the_service
        try:
            kubernetes_validate.validate(obj, kube, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} against {kube}: {where}: {err.message}")
        checked += 1
    assert checked == len([o for o in objects if o["kind"] != "ServiceMonitor"]) >= 5


def test_the_values_schema_refuses_a_misspelt_value() -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match="timeoutSecond"):
        render({"drain": {"timeoutSecond": 30}})
    with pytest.raises(helm_python.HelmError, match="replicaCont"):
        render({"replicaCont": 3})


def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_none(v) for v in value]
    return value


# Run in a child process: the operator's types are a 2 MB module of pydantic models, ~175,000 objects
# that would stay in the test process and make every full garbage collection of the rest of the suite
# ~150 ms slower (enough to starve the timing-sensitive gateway tests on a loaded machine).
_VALIDATE_SERVICE_MONITOR = """
import json, sys
from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor
model = ServiceMonitor.model_validate(json.load(sys.stdin))
print(json.dumps(model.model_dump(by_alias=True, exclude_none=True, mode="json")))
"""


def test_the_service_monitor_is_valid_and_scrapes_the_service() -> None:
    objects = render(values_for("all-on"))
    sm = one(objects, "ServiceMonitor")
    # Types, patterns and required fields of the CRD (pydantic names the field that fails).
    out = subprocess.run(
        [sys.executable, "-c", _VALIDATE_SERVICE_MONITOR],
        input=json.dumps(sm),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # The operator's types ignore unknown fields instead of refusing them: what survives the round
    # trip is what the operator understands, and it must be all of it.
    assert _strip_none(json.loads(out.stdout)) == sm

    service = one(objects, "Service")
    selector = sm["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # the operator's selector


# --- the config kvgate reads -------------------------------------------------------------------


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_the_configmap_holds_a_config_kvgate_loads(value_set: str) -> None:
    objects = render(values_for(value_set))
    data = kvgate_config(objects)
    config = load_like_kvgate(data)
    port = container(objects)["ports"][0]["containerPort"]
    assert config.server.port == port
    assert data["server"]["drain_propagation_s"] >= 0 and data["server"]["drain_timeout_s"] > 0
    # The container runs `kvgate serve` on the file the ConfigMap is mounted as.
    args = container(objects)["args"]
    assert args[0] == "serve"
    path = Path(args[args.index("--config") + 1])
    (mount,) = [m for m in container(objects)["volumeMounts"] if m["name"] == "config"]
    assert path.parent == Path(mount["mountPath"]) and path.name in one(objects, "ConfigMap")["data"]


def test_the_config_is_the_users_plus_what_the_chart_owns() -> None:
    values = values_for("all-on")
    data = kvgate_config(render(values))
    assert data["tenants"] == values["config"]["tenants"]
    assert data["flow_control"] == values["config"]["flow_control"]
    assert data["server"] == {
        "host": "::", "port": 9090, "drain_propagation_s": 3, "drain_timeout_s": 300.5,
    }  # fmt: skip
    assert data["state"] == {"store": values["redis"]["url"], "gateways": 3}
    assert data["discovery"] == {
        "kubernetes": {"namespace": "llm", "service": "vllm", "port": 8000, "model": "llama-3-8b"}
    }


def test_without_redis_the_store_is_the_configs_and_gateways_follows_the_replica_count() -> None:
    data = kvgate_config(render({"replicaCount": 4}))
    assert data["state"] == {"gateways": 4}
    assert load_like_kvgate(data).state.store == "memory://"
    data = kvgate_config(render({"replicaCount": 4, "config": {"state": {"gateways": 6}}}))
    assert data["state"] == {"gateways": 6}  # the user's own count wins


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"server": {"port": 9000}}}, "config.server.port is set by the chart: set containerPort"),
        ({"config": {"server": {"host": "::"}}}, "set listenAddress instead"),
        ({"config": {"server": {"drain_timeout_s": 9}}}, "set drain.timeoutSeconds instead"),
        ({"config": {"server": {"drain_propagation_s": 1}}}, "set drain.propagationSeconds instead"),
        ({"redis": {"url": "redis://r:6379/0"}, "config": {"state": {"store": "redis://x:6379/0"}}},
         "config.state.store is set by the chart when redis.url is given"),
        ({"config": {"discovery": {"kubernetes": {"service": "vllm"}}}},
         "discovery.kubernetes.enabled is false"),
        ({"discovery": {"kubernetes": {"enabled": True, "service": "vllm"}},
          "config": {"discovery": {"kubernetes": {"namespace": "other"}}}},
         "config.discovery.kubernetes.namespace is set by the chart"),
        ({"discovery": {"kubernetes": {"enabled": True}}}, "exactly one of service and selector"),
        ({"discovery": {"kubernetes": {"enabled": True, "service": "a", "selector": "app=b"}}},
         "exactly one of service and selector"),
        ({"replicaCredentials": {"enabled": True}}, "replicaCredentials.apiKey"),
        ({"podDisruptionBudget": {"minAvailable": 1}}, "exactly one of maxUnavailable and minAvailable"),
    ],
)  # fmt: skip
def test_conflicting_values_fail_the_render_naming_what_to_set(values: dict[str, Any], message: str) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match=message.replace(".", r"\.")):
        render(values)


def test_a_config_change_rolls_the_pods_unless_told_not_to() -> None:
    def checksum(values: dict[str, Any]) -> str | None:
        annotations = one(render(values), "Deployment")["spec"]["template"]["metadata"].get("annotations", {})
        return annotations.get("checksum/config")  # type: ignore[no-any-return]

    a = checksum({"config": {"flow_control": {"max_queue": 10}}})
    b = checksum({"config": {"flow_control": {"max_queue": 11}}})
    assert a and b and a != b
    assert checksum({"rolloutOnConfigChange": False, "metrics": {"podAnnotations": False}}) is None


# --- drain: probes and grace period ------------------------------------------------------------


@pytest.mark.parametrize(
    ("propagation", "timeout", "margin"), [(5, 120, 10), (3, 300.5, 15), (1, 1, 0), (4.2, 30, 0.3)]
)
def test_grace_period_covers_propagation_and_drain_from_the_configs_own_numbers(
    propagation: float, timeout: float, margin: float
) -> None:
    objects = render(
        {
            "drain": {"propagationSeconds": propagation, "timeoutSeconds": timeout, "marginSeconds": margin},
            "probes": {"readiness": {"periodSeconds": 1, "failureThreshold": 1}},
        }
    )
    server = kvgate_config(objects)["server"]
    grace = pod_spec(objects)["terminationGracePeriodSeconds"]
    assert isinstance(grace, int)
    assert server["drain_propagation_s"] == propagation and server["drain_timeout_s"] == timeout
    assert grace == math.ceil(server["drain_propagation_s"] + server["drain_timeout_s"] + margin)
    assert grace >= server["drain_propagation_s"] + server["drain_timeout_s"]


def test_the_chart_default_grace_period() -> None:
    objects = render()
    server = kvgate_config(objects)["server"]
    assert server["drain_propagation_s"] <= 5  # within kvgate's own default window
    assert pod_spec(objects)["terminationGracePeriodSeconds"] == 5 + 120 + 10


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_probes_follow_the_drain_semantics(value_set: str) -> None:
    objects = render(values_for(value_set))
    c = container(objects)
    port_names = {p["name"] for p in c["ports"]}
    # Readiness on /ready: it turns 503 at the first moment of a drain, so the pod leaves the endpoints.
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    # Liveness and startup on /health: it stays 200 while draining, so the kubelet never kills a drain.
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert port_names == {"http"}
    # kvgate drains by itself on SIGTERM: no preStop sleep eating into the grace period.
    assert "lifecycle" not in c
    r = c["readinessProbe"]
    assert (
        r["periodSeconds"] * r["failureThreshold"] <= kvgate_config(objects)["server"]["drain_propagation_s"]
    )


def test_a_readiness_probe_slower_than_the_propagation_window_is_refused() -> None:
    with pytest.raises(Exception, match=r"periodSeconds x failureThreshold \(10 s\) must fit"):
        render({"probes": {"readiness": {"periodSeconds": 5, "failureThreshold": 2}}})


def test_rolling_updates_start_a_new_pod_before_draining_an_old_one() -> None:
    strategy = one(render(), "Deployment")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


# --- selectors, disruption budget, metrics ------------------------------------------------------


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_service_pdb_and_deployment_select_the_pods(value_set: str) -> None:
    objects = render(values_for(value_set))
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (
        deployment["spec"]["selector"]["matchLabels"],
        one(objects, "Service")["spec"]["selector"],
        one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
    ):
        assert selector and selector.items() <= pod_labels.items()
    service = one(objects, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_the_disruption_budget_takes_either_bound() -> None:
    assert one(render(), "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    spec = one(render(values_for("all-on")), "PodDisruptionBudget")["spec"]
    assert spec["minAvailable"] == "50%" and "maxUnavailable" not in spec


def test_scrape_annotations_point_at_the_metrics_port() -> None:
    objects = render(values_for("all-on"))
    annotations = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) == container(objects)["ports"][0]["containerPort"] == 9090


# --- discovery RBAC ----------------------------------------------------------------------------


def _rbac(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    return one(objects, "Role"), one(objects, "RoleBinding")


def test_discovery_by_service_may_read_endpointslices_where_the_replicas_run() -> None:
    objects = render(values_for("all-on"))
    role, binding = _rbac(objects)
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "llm"
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"],
    }  # fmt: skip
    spec = pod_spec(objects)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": NAMESPACE}
    ]
    assert one(objects, "ServiceAccount")["metadata"]["name"] == spec["serviceAccountName"] == "kvgate-gw"
    assert spec["automountServiceAccountToken"] is True


def test_discovery_by_selector_may_read_pods_in_the_release_namespace_by_default() -> None:
    objects = render({"discovery": {"kubernetes": {"enabled": True, "selector": "app=vllm", "model": "m"}}})
    role, binding = _rbac(objects)
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert kvgate_config(objects)["discovery"]["kubernetes"] == {
        "namespace": NAMESPACE, "selector": "app=vllm", "port": 8000, "model": "m",
    }  # fmt: skip


def test_discovery_keeps_the_users_other_kubernetes_settings() -> None:
    data = kvgate_config(
        render(
            {
                "discovery": {"kubernetes": {"enabled": True, "service": "vllm"}},
                "config": {"discovery": {"kubernetes": {"resync_s": 30}, "file": {"path": "/x"}}},
            }
        )
    )
    assert data["discovery"] == {
        "kubernetes": {"resync_s": 30, "namespace": NAMESPACE, "service": "vllm", "port": 8000},
        "file": {"path": "/x"},
    }


def test_no_discovery_no_rbac_and_no_token() -> None:
    objects = render()
    assert not [o for o in objects if o["kind"] in ("Role", "RoleBinding", "ClusterRole")]
    assert pod_spec(objects)["automountServiceAccountToken"] is False
    assert one(objects, "ServiceAccount")["automountServiceAccountToken"] is False
    assert "discovery" not in kvgate_config(objects)


def test_rbac_can_be_left_to_the_operator() -> None:
    objects = render(
        {"discovery": {"kubernetes": {"enabled": True, "service": "vllm"}, "rbac": {"create": False}}}
    )
    assert "Role" not in kinds(objects)
    assert kvgate_config(objects)["discovery"]["kubernetes"]["service"] == "vllm"


# --- replica credentials -----------------------------------------------------------------------


def test_replica_credentials_from_the_charts_secret_as_env_and_file() -> None:
    import base64

    objects = render(values_for("all-on"))
    secret = one(objects, "Secret")
    assert base64.b64decode(secret["data"]["api-key"]) == b"not-a-real-key"
    c = container(objects)
    (env,) = [e for e in c["env"] if e["name"] == "KVGATE_REPLICA_API_KEY"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "api-key"}
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "replica-credentials"]
    assert mount == {"name": "replica-credentials", "mountPath": "/var/run/secrets/kvgate", "readOnly": True}
    (volume,) = [v for v in pod_spec(objects)["volumes"] if v["name"] == "replica-credentials"]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    # Group-readable for the pod's fsGroup: the image runs as a non-root user.
    assert volume["secret"]["defaultMode"] == 0o440
    assert pod_spec(objects)["securityContext"]["fsGroup"] == 10001


def test_replica_credentials_from_an_existing_secret() -> None:
    objects = render(
        {
            "replicaCredentials": {
                "enabled": True,
                "existingSecret": "vllm-api",
                "key": "token",
                "env": "VLLM_KEY",
            }
        }
    )
    assert "Secret" not in kinds(objects)
    (env,) = container(objects)["env"]
    assert env == {"name": "VLLM_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm-api", "key": "token"}}}


def test_no_secret_by_default_and_the_config_holds_only_key_hashes() -> None:
    objects = render(values_for("all-on"))
    assert "not-a-real-key" not in yaml.safe_dump(one(objects, "ConfigMap"))
    for tenant in kvgate_config(objects)["tenants"]:
        assert all(k.startswith("sha256:") for k in tenant["api_keys"])
    objects = render()
    assert "Secret" not in kinds(objects) and "env" not in container(objects)


# --- image and notes ---------------------------------------------------------------------------


def test_the_image_default_is_the_demo_and_the_chart_serves() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text().splitlines()
    (cmd,) = [line for line in dockerfile if line.startswith("CMD ")]
    assert cmd.startswith('CMD ["up"')
    c = container(render())
    assert c["args"][0] == "serve" and c["image"] == "kvgate:0.1.0"


def test_the_notes_warn_about_a_config_kvgate_serve_would_refuse() -> None:
    assert "names no replicas" in render_notes()
    notes = render_notes(
        {"config": {"replicas": [{"url": "http://vllm:8000", "model": "m"}]}, "replicaCount": 1}
    )
    assert "names no replicas" not in notes and "terminationGracePeriodSeconds: 135" in notes
    assert "each pod enforces" in render_notes(
        {"config": {"replicas": [{"url": "http://v:8000", "model": "m"}]}}
    )


def test_future_config_keys_are_only_the_ones_named_by_the_issue() -> None:
    # The list shrinks as the features land (a key the model knows is no longer stripped); a key
    # that is neither known nor listed fails the config tests above.
    assert set(FUTURE_CONFIG_KEYS) <= {
        ("server", "drain_propagation_s"), ("server", "drain_timeout_s"), ("discovery",),
    }  # fmt: skip
    assert _known(("server", "port")) and "port" in ServerConfig.model_fields
