"""The `discovery:` section of the config: where kvgate learns of replicas besides the static list.

    discovery:
      kubernetes: {namespace: inference, service: vllm, port: 8000, model: llama-3-8b}  # EndpointSlices
      # or {namespace: inference, selector: "app=vllm", port: 8000}                     # pods
      dns: {name: vllm-headless.inference.svc.cluster.local, port: 8000, interval_s: 5}
      file: {path: /etc/kvgate/replicas.yaml, interval_s: 1}  # a YAML list in the `replicas:` format
      stale_after_s: 120   # /ready says not ready when a source has not synced for this long
      slow_start_s: 0      # ramp a newly ready replica's share over this many seconds (0: off)

Each source is optional, and they combine with `replicas:` (on a name given twice, the static list
wins, then file, kubernetes, dns). A discovered replica is not ready until its `/v1/models` lists its
model; without `model`, its pool is the first base model it lists. Durations are seconds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KubernetesDiscoveryConfig(_Strict):
    """EndpointSlices of a Service (`service`), or pods matching a label selector (`selector`)."""

    namespace: str = Field(min_length=1)
    service: str | None = Field(None, min_length=1)
    selector: str | None = Field(None, min_length=1)  # "app=vllm,tier=gpu" (equality-based)
    port: int = Field(ge=1, le=65535)  # the replicas' own port (the container port)
    model: str | None = Field(None, min_length=1)  # the pool; None: from each replica's /v1/models
    scheme: Literal["http", "https"] = "http"
    # None: in-cluster (the pod's service account token and CA), else ~/.kube/config. A path: that
    # kubeconfig file, at `context` (None: its current context).
    kubeconfig: str | None = None
    context: str | None = None
    resync_s: float = Field(30.0, gt=0, allow_inf_nan=False)  # full re-list at least this often
    watch_timeout_s: int = Field(300, ge=1)  # the API server ends one watch request after this
    request_timeout_s: float = Field(10.0, gt=0, allow_inf_nan=False)  # a list; a watch's connect
    retry_s: float = Field(1.0, gt=0, allow_inf_nan=False)  # after a failure; doubles up to 30 s
    labels: dict[str, str] = Field(default_factory=dict)  # added to every replica's labels

    @model_validator(mode="after")
    def _one_target(self) -> KubernetesDiscoveryConfig:
        if (self.service is None) == (self.selector is None):
            raise ValueError("give exactly one of service (EndpointSlices) or selector (pods)")
        return self


class DnsDiscoveryConfig(_Strict):
    """A name's A and AAAA records (a headless Service, a DNS round-robin), resolved every interval."""

    name: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    model: str | None = Field(None, min_length=1)
    scheme: Literal["http", "https"] = "http"
    interval_s: float = Field(5.0, gt=0, allow_inf_nan=False)
    timeout_s: float = Field(2.0, gt=0, allow_inf_nan=False)  # one resolution, both record types
    # "host" or "host:port" ("[v6]:port"); empty: the system's resolvers (/etc/resolv.conf).
    nameservers: tuple[str, ...] = ()
    labels: dict[str, str] = Field(default_factory=dict)


class FileDiscoveryConfig(_Strict):
    """A YAML file holding a list in the `replicas:` format, re-read when it changes."""

    path: str = Field(min_length=1)
    interval_s: float = Field(1.0, gt=0, allow_inf_nan=False)


class DiscoveryConfig(_Strict):
    kubernetes: KubernetesDiscoveryConfig | None = None
    dns: DnsDiscoveryConfig | None = None
    file: FileDiscoveryConfig | None = None
    stale_after_s: float = Field(120.0, gt=0, allow_inf_nan=False)
    slow_start_s: float = Field(0.0, ge=0, allow_inf_nan=False)

    @property
    def configured(self) -> bool:
        """At least one source is configured."""
        return any(s is not None for s in (self.kubernetes, self.dns, self.file))

    @model_validator(mode="after")
    def _stale_after_each_sync(self) -> DiscoveryConfig:
        periods = {
            "kubernetes.resync_s": None if self.kubernetes is None else self.kubernetes.resync_s,
            "dns.interval_s": None if self.dns is None else self.dns.interval_s,
            "file.interval_s": None if self.file is None else self.file.interval_s,
        }
        for path, period in periods.items():
            if period is not None and self.stale_after_s <= 2 * period:
                raise ValueError(
                    f"stale_after_s ({self.stale_after_s:g}) must be more than twice {path} "
                    f"({period:g}): a source that syncs on time must never look stale"
                )
        return self
