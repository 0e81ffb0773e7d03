"""Kubernetes objects (as the API serves them, plain JSON) -> replica specs. Pure.

EndpointSlice (discovery.k8s.io/v1), per endpoint:
- `conditions.terminating` true -> TERMINATING (the pod is shutting down: no new requests, its
  streams finish);
- else `conditions.ready` true, or absent ("unknown state ... should be interpreted as ready", API
  reference) -> READY;
- else -> NOT_READY (kept, not selectable).
An endpoint is named after the pod it points to (`targetRef.name`), else its first address; a name
found in two slices (dual-stack IPv4 and IPv6 slices of one pod) keeps the first in slice-name order,
so the choice does not depend on event order.

Pod (v1): a pod without an IP yet, or that has ended (`Succeeded`, `Failed`), is no replica; one with
`metadata.deletionTimestamp` is TERMINATING; one that is `Running` with condition `Ready` True is
READY; any other is NOT_READY.

The replica's URL is `scheme://address:port` with the configured port (the container's port).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.config_discovery import KubernetesDiscoveryConfig
from gateway.fleet.membership import ReplicaSpec
from policies.types import ReplicaPhase

SOURCE = "kubernetes"


def endpoint_phase(conditions: Mapping[str, Any] | None) -> ReplicaPhase:
    c = conditions or {}
    if c.get("terminating") is True:
        return ReplicaPhase.TERMINATING
    if c.get("ready") is not False:
        return ReplicaPhase.READY
    return ReplicaPhase.NOT_READY


def pod_phase(pod: Mapping[str, Any]) -> ReplicaPhase | None:
    """The pod's replica phase, or None when it is no replica (no IP yet, or ended)."""
    status = pod.get("status") or {}
    if not status.get("podIP") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return ReplicaPhase.TERMINATING
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
    )
    return ReplicaPhase.READY if ready and status.get("phase") == "Running" else ReplicaPhase.NOT_READY


def _url(cfg: KubernetesDiscoveryConfig, address: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{cfg.scheme}://{host}:{cfg.port}"


def _spec(
    cfg: KubernetesDiscoveryConfig,
    name: str,
    address: str,
    phase: ReplicaPhase,
    extra_labels: Mapping[str, str],
    slow_start_s: float,
) -> ReplicaSpec:
    return ReplicaSpec(
        name=name,
        url=_url(cfg, address),
        model=cfg.model,
        labels={**extra_labels, **cfg.labels},
        phase=phase,
        await_model=True,
        slow_start_s=slow_start_s,
        source=SOURCE,
    )


def specs_from_endpoint_slices(
    slices: Iterable[Mapping[str, Any]], cfg: KubernetesDiscoveryConfig, slow_start_s: float = 0.0
) -> dict[str, ReplicaSpec]:
    """Every endpoint of `slices` with an address, as a spec (see the module doc)."""
    specs: dict[str, ReplicaSpec] = {}
    for s in sorted(slices, key=lambda s: str((s.get("metadata") or {}).get("name", ""))):
        for ep in s.get("endpoints") or ():
            addresses = ep.get("addresses") or ()
            if not addresses:
                continue
            target = ep.get("targetRef") or {}
            name = str(target.get("name") or addresses[0])
            if name in specs:
                continue
            labels = {}
            if ep.get("zone"):
                labels["zone"] = str(ep["zone"])
            if ep.get("nodeName"):
                labels["node"] = str(ep["nodeName"])
            specs[name] = _spec(
                cfg, name, str(addresses[0]), endpoint_phase(ep.get("conditions")), labels, slow_start_s
            )
    return specs


def specs_from_pods(
    pods: Iterable[Mapping[str, Any]], cfg: KubernetesDiscoveryConfig, slow_start_s: float = 0.0
) -> dict[str, ReplicaSpec]:
    """Every pod that is a replica, as a spec (see the module doc)."""
    specs: dict[str, ReplicaSpec] = {}
    for pod in pods:
        phase = pod_phase(pod)
        if phase is None:
            continue
        name = str((pod.get("metadata") or {}).get("name", ""))
        node = (pod.get("spec") or {}).get("nodeName")
        labels = {"node": str(node)} if node else {}
        specs[name] = _spec(cfg, name, str(pod["status"]["podIP"]), phase, labels, slow_start_s)
    return specs
