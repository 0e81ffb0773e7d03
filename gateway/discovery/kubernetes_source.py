"""Kubernetes discovery: a Service's EndpointSlices, or the pods of a label selector, as replicas.

The collection is kept by `kube_watch.ListWatch` (list, watch with bookmarks, re-list on 410, on
every reconnect and every `resync_s`), each object turned into replica specs by `kube_objects`
(ready, not ready, terminating), and the whole set handed to the reconciler on every change.

Client: lightkube, for its kubeconfig handling — in-cluster (the service account's token, re-read
when it rotates, and CA), or a kubeconfig file with its contexts, client certificates, tokens and
exec plugins — which yields an authenticated `httpx2.AsyncClient`. lightkube was chosen over
kubernetes-asyncio (the generated client: large, and its watch helper's reconnect handling is what
this source must control) because it is small, typed, async and well kept. Its own `watch()` is not
used: it resumes a closed watch from the last resourceVersion without re-listing and does not ask
for bookmarks, which is the failure mode (a lost delete) this source exists to rule out.

RBAC: `list` and `watch` on `endpointslices` (discovery.k8s.io) or `pods` in the namespace
(the Helm chart, deploy/helm/kvgate).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import httpx2 as httpx
from lightkube.config.client_adapter import AsyncClient as build_async_client
from lightkube.config.client_adapter import ConnectionParams
from lightkube.config.kubeconfig import KubeConfig, SingleConfig

from gateway.config_discovery import KubernetesDiscoveryConfig
from gateway.discovery.kube_objects import SOURCE, specs_from_endpoint_slices, specs_from_pods
from gateway.discovery.kube_watch import Collection, ListWatch, Objects, Timing
from gateway.discovery.reconciler import Reconciler
from gateway.fleet.membership import ReplicaSpec

ENDPOINT_SLICES = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
PODS = "/api/v1/namespaces/{ns}/pods"
SERVICE_LABEL = "kubernetes.io/service-name"


def load_kube_config(cfg: KubernetesDiscoveryConfig) -> SingleConfig:
    """The API server and credentials: `cfg.kubeconfig` at `cfg.context`, or (None) in-cluster first,
    then $KUBECONFIG or ~/.kube/config. Reads files: call it off the event loop. Raises ValueError."""
    try:
        if cfg.kubeconfig is None:
            kube = KubeConfig.from_env()
        else:
            kube = KubeConfig.from_file(cfg.kubeconfig)
        single = kube.get(context_name=cfg.context)
    except Exception as err:  # lightkube's ConfigError, a missing file or variable, bad YAML
        raise ValueError(f"cannot load the Kubernetes client config: {err}") from err
    if single is None:
        raise ValueError(
            f"no context {cfg.context!r} in the kubeconfig" if cfg.context else "no current context"
        )
    return single


def build_client(single: SingleConfig, request_timeout_s: float) -> httpx.AsyncClient:
    """lightkube's authenticated client for `single` (no proxy variables: the API server is direct)."""
    params = ConnectionParams(timeout=httpx.Timeout(request_timeout_s), trust_env=False)
    return build_async_client(single, params)


def collection_of(cfg: KubernetesDiscoveryConfig) -> Collection:
    if cfg.service is not None:
        return Collection(ENDPOINT_SLICES.format(ns=cfg.namespace), f"{SERVICE_LABEL}={cfg.service}")
    assert cfg.selector is not None  # the config allows exactly one of the two
    return Collection(PODS.format(ns=cfg.namespace), cfg.selector)


class KubernetesSource:
    """Watches one collection and reports its replicas (see the module doc). `client` (tests, or a
    caller that built one) is used as is and not closed; otherwise one is built from the config."""

    name = SOURCE

    def __init__(
        self,
        cfg: KubernetesDiscoveryConfig,
        reconciler: Reconciler,
        *,
        slow_start_s: float = 0.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self._cfg = cfg
        self._reconciler = reconciler
        self._slow_start_s = slow_start_s
        self._client = client
        self._convert: Callable[..., dict[str, ReplicaSpec]] = (
            specs_from_endpoint_slices if cfg.service is not None else specs_from_pods
        )
        self._last: dict[str, ReplicaSpec] | None = None
        self.list_watch: ListWatch | None = None
        self.synced = asyncio.Event()  # set after the first list, good or not

    async def run(self) -> None:
        cfg = self._cfg
        own = self._client is None
        if self._client is None:
            try:
                single = await asyncio.to_thread(load_kube_config, cfg)
            except ValueError as err:
                self._reconciler.failed(self.name, str(err))
                self.synced.set()
                raise
            self._client = build_client(single, cfg.request_timeout_s)
        self.list_watch = ListWatch(
            self._client,
            collection_of(cfg),
            Timing(cfg.resync_s, cfg.watch_timeout_s, cfg.request_timeout_s, cfg.retry_s),
            on_sync=self._on_sync,
            on_alive=self._on_alive,
            on_error=self._on_error,
        )
        try:
            await self.list_watch.run()
        finally:
            if own:
                await self._client.aclose()

    def _on_sync(self, objects: Objects) -> None:
        items: list[Mapping[str, Any]] = list(objects.values())
        specs = self._convert(items, self._cfg, self._slow_start_s)
        if specs == self._last:
            self._reconciler.touch(self.name)
        else:
            self._last = specs
            self._reconciler.update(self.name, specs)
        self.synced.set()

    def _on_alive(self) -> None:
        self._reconciler.touch(self.name)

    def _on_error(self, message: str) -> None:
        self._reconciler.failed(self.name, message)
        self.synced.set()
