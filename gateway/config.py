"""kvgate's one YAML config, validated at load with pydantic.

Unknown keys and bad values are refused with the dotted path of the field and the reason
(`ConfigError`). Durations are seconds (`*_s`), sizes bytes (`*_bytes`), limits per minute.
Every section has defaults, so an empty file is a valid config (the embedded simulated fleet,
no tenants, in-memory state).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.config_discovery import DiscoveryConfig
from gateway.config_flow import BandConfig as BandConfig  # re-exported: part of Config
from gateway.config_flow import BandName as BandName
from gateway.config_flow import FairShareConfig as FairShareConfig
from gateway.config_flow import FlowControlConfig as FlowControlConfig
from gateway.config_flow import SaturationConfig as SaturationConfig
from gateway.config_headroom import HeadroomConfig
from gateway.config_latency import LatencyPriorConfig
from gateway.config_routes import RouteConfig, check_adapter_sources, route_problems
from gateway.config_simulator import SimulatorConfig as SimulatorConfig  # re-exported: part of Config
from gateway.config_slo import SloConfig
from gateway.config_tenancy import (
    AdminKeyConfig,
    KeyConfig,
    LedgerConfig,
    QuotaConfig,
    check_key_hash,
    unique_quota_names,
)
from gateway.kv_events.address import parse_tcp_endpoint
from gateway.upstream.address import parse_replica_url

MAX_WORKERS = 64


class ConfigError(ValueError):
    """A config that cannot be used; `str()` lists each problem as `path: reason`."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(_Strict):
    """The client side. The timeouts bound RECEIVING a request, never answering it (a stream may run
    as long as the replica streams): `header_timeout_s` from the connection's first byte of a request
    (or its opening) to the end of the headers, `body_timeout_s` from there to the end of the body,
    as a whole (a body that trickles a byte a second still ends). Past either: 408 and close.
    `keep_alive_timeout_s`: an idle connection between requests. Past `max_connections` open
    connections, a new one's request is answered 503 with Retry-After and the connection closed."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0)
    # A client whose connection takes nothing for this long is dropped (recorded as 499, the request
    # aborted on the replica): a client that stopped reading must not hold a replica's slot.
    send_timeout_s: float = Field(30.0, gt=0)
    header_timeout_s: float = Field(10.0, gt=0, allow_inf_nan=False)
    body_timeout_s: float = Field(30.0, gt=0, allow_inf_nan=False)
    keep_alive_timeout_s: float = Field(30.0, gt=0, allow_inf_nan=False)
    max_connections: int = Field(2048, ge=1)
    debug_headers: bool = False  # adds x-kvgate-route with the winner's per-scorer scores
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # One JSON line per request on stdout (logger `kvgate.access`): tenant, model, replica, status,
    # tokens, TTFT, duration, retries, request id. Never a key or a prompt.
    access_log: bool = True
    # Drain on SIGTERM/SIGINT (gateway/drain.py): /ready answers 503 at once while new requests are
    # still served for drain_propagation_s (load balancers take kvgate out meanwhile), then they and
    # the queued ones get 503 + Retry-After; requests in flight get drain_timeout_s more, after which
    # a stream ends with an SSE error event. kvgate exits as soon as nothing is in flight.
    drain_propagation_s: float = Field(5.0, ge=0, allow_inf_nan=False)
    drain_timeout_s: float = Field(120.0, gt=0, allow_inf_nan=False)
    # Reload the config file when its content changes, looked at every watch_config_interval_s
    # (SIGHUP and POST /admin/reload reload it either way; gateway/reload.py).
    watch_config: bool = False
    watch_config_interval_s: float = Field(2.0, gt=0, allow_inf_nan=False)
    # Processes accepting on the port (SO_REUSEPORT, Linux) under a supervising parent
    # (gateway/supervisor.py); `kvgate serve --workers N` overrides it. Above 1 the limits must be
    # shared through Redis (state.store), and state.gateways counts kvgate instances, not processes:
    # each worker enforces its share of a limit as one of gateways x workers processes. 1: one
    # process, no parent.
    workers: int = Field(1, ge=1, le=MAX_WORKERS)


class ReplicaCredential(_Strict):
    """Where the key for a replica's `vllm serve --api-key` comes from: an environment variable or a
    file (a mounted Secret), never the config itself, which may live in a ConfigMap. kvgate sends it as
    `Authorization: Bearer <key>` to the replica; the client's own key never reaches a replica. Set
    per pool (`models[]`), overridable per replica (`replicas[]`)."""

    api_key_env: str | None = Field(None, min_length=1)
    api_key_file: str | None = Field(None, min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _never_inline(cls, data: Any) -> Any:
        if isinstance(data, dict) and "api_key" in data:
            raise ValueError(
                "api_key: a replica key is never written in the config; "
                "name an environment variable (api_key_env) or a file (api_key_file) holding it"
            )
        return data

    @model_validator(mode="after")
    def _one_source(self) -> ReplicaCredential:
        if self.api_key_env is not None and self.api_key_file is not None:
            raise ValueError("give api_key_env or api_key_file, not both")
        return self

    @property
    def has_credential(self) -> bool:
        return self.api_key_env is not None or self.api_key_file is not None


class KvEventsConfig(_Strict):
    """Where a pool's replicas publish their KV-cache events (vLLM's `--kv-events-config`): kvgate
    subscribes at `tcp://<the replica's host>:port` and asks `replay_port` for batches it missed. For
    replicas without their own `kv_events` (discovered ones, mostly)."""

    port: int = Field(ge=1, le=65535)
    replay_port: int | None = Field(None, ge=1, le=65535)  # none: missed batches are lost for good
    topic: str = ""  # vLLM's default; kvgate subscribes to this prefix of the topic frame


class ModelConfig(ReplicaCredential):
    """Per-pool settings. A pool is named by its base model, as the replicas serve it. The credential
    fields (`api_key_env`, `api_key_file`) apply to every replica of the pool."""

    name: str = Field(min_length=1)
    # none: ~4 bytes per token; sim: the simulator's own tokenizer (exact counts and token blocks);
    # anything else: a directory with the model's tokenizer files (tokenizer.json, tokenizer_config.json,
    # chat_template.jinja), so counts and blocks are the engine's own ids (gateway/hf_tokenizer.py). A
    # relative path is taken from the config file's directory; it is kept absolute once validated.
    tokenizer: str = Field("none", min_length=1)
    # LoRA adapters kvgate may load on this pool's replicas when none holds one a request needs:
    # served name -> source path for vLLM's POST /v1/load_lora_adapter (gateway/adapter_loader.py).
    adapters: dict[str, str] = Field(default_factory=dict)
    max_adapters_per_replica: int | None = Field(None, ge=1)  # past it, least recently used unloaded
    adapter_load_timeout_s: float = Field(30.0, gt=0, allow_inf_nan=False)  # a request waits this long
    # The replicas' KV-cache event sockets, for the exact prefix index (gateway/kv_events/).
    kv_events: KvEventsConfig | None = None
    # The predicted-latency model's starting point for this pool (gateway/config_latency.py).
    latency_prior: LatencyPriorConfig | None = None

    @field_validator("adapters")
    @classmethod
    def _adapter_sources(cls, v: dict[str, str]) -> dict[str, str]:
        return check_adapter_sources(v)

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_path(cls, v: str, info: ValidationInfo) -> str:
        if v in ("none", "sim"):
            return v
        base = (info.context or {}).get("config_dir")
        return os.path.normpath(Path(base or Path.cwd(), v))  # an absolute v stays as it is


class ReplicaConfig(ReplicaCredential):
    # The credential fields, when set, replace the pool's (`models[]`) for this replica.
    # http:// or https://, host, optional port, optional path prefix put before every request path;
    # no credentials, query or fragment (gateway/upstream/address.py).
    url: str
    model: str = Field(min_length=1)  # the pool: base model this replica serves
    name: str | None = None  # defaults to the URL without its scheme: host:port[/prefix]
    labels: dict[str, str] = Field(default_factory=dict)
    # vLLM's KV-cache event sockets as kvgate reaches them (tcp://host:port): the PUB `endpoint` and
    # the ROUTER `replay_endpoint` of its --kv-events-config. They replace the pool's `kv_events`.
    kv_events: str | None = None
    kv_events_replay: str | None = None

    @field_validator("url")
    @classmethod
    def _replica_url(cls, v: str) -> str:
        parse_replica_url(v)  # the upstream client's own rules; ValueError says what is wrong
        return v.rstrip("/")

    @field_validator("kv_events", "kv_events_replay")
    @classmethod
    def _kv_endpoint(cls, v: str | None) -> str | None:
        if v is not None:
            parse_tcp_endpoint(v)
        return v

    @model_validator(mode="after")
    def _replay_needs_events(self) -> ReplicaConfig:
        if self.kv_events_replay is not None and self.kv_events is None:
            raise ValueError("kv_events_replay: needs kv_events (the socket whose batches it replays)")
        return self

    @property
    def display_name(self) -> str:
        return self.name or self.url.split("//", 1)[1]


class FleetConfig(_Strict):
    scrape_interval_s: float = Field(0.2, gt=0)
    scrape_timeout_s: float = Field(0.5, gt=0)
    stale_after_s: float = Field(1.0, gt=0)  # older metrics count as saturated
    health_interval_s: float = Field(1.0, gt=0)
    health_timeout_s: float = Field(0.5, gt=0)
    eject_after_failures: int = Field(2, ge=1)
    eject_backoff_s: float = Field(1.0, gt=0)  # first ejection; doubles per repeat
    eject_backoff_max_s: float = Field(30.0, gt=0)
    models_poll_interval_s: float = Field(5.0, gt=0)


class UpstreamConfig(_Strict):
    connect_timeout_s: float = Field(1.0, gt=0)
    first_byte_timeout_s: float = Field(60.0, gt=0)  # covers replica queueing and prefill
    chunk_timeout_s: float = Field(30.0, gt=0)  # between two chunks of a stream
    response_timeout_s: float = Field(600.0, gt=0)  # non-streaming: until the whole answer
    max_retries: int = Field(2, ge=0, le=10)  # extra replicas tried before the first byte
    idle_connections_per_replica: int = Field(256, ge=1)  # keep-alive connections kept for reuse
    # https:// replicas: a PEM bundle to trust instead of the system's CAs (a private CA), and
    # whether certificates and host names are checked at all (false: check-config warns).
    tls_ca_file: str | None = None
    tls_verify: bool = True


class PluginSpec(_Strict):
    type: str
    name: str | None = None
    weight: float | None = None
    params: dict[str, Any] = Field(default_factory=dict)


class ProfileConfig(_Strict):
    filters: tuple[PluginSpec, ...] = ()
    scorers: tuple[PluginSpec, ...] = ()
    picker: PluginSpec = PluginSpec(type="max-score")


class PrefixIndexConfig(_Strict):
    block_tokens: int = Field(64, ge=1)  # index block; a multiple of the engine's saves memory
    default_capacity_tokens: int = Field(400_000, ge=1)  # until cache_config_info is scraped
    # The exact index (replicas with `kv_events`): a replica whose events stay silent this long after
    # a request was sent to it is routed on the approximate index until they resume; a replay that
    # has not ended after replay_timeout_s counts as failed (the missed batches are lost).
    events_stale_after_s: float = Field(10.0, gt=0, allow_inf_nan=False)
    replay_timeout_s: float = Field(2.0, gt=0, allow_inf_nan=False)


class SchedulingConfig(_Strict):
    profile: str = "default"
    profiles: dict[str, ProfileConfig] = Field(default_factory=dict)  # added to / overriding built-ins
    prefix_index: PrefixIndexConfig = PrefixIndexConfig()
    session_header: str = "x-session-id"
    seed: int | None = None  # tie-breaking randomness; None = from the OS


class TenantLimits(_Strict):
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    rpm_burst: int | None = Field(None, ge=1)
    tpm_burst: int | None = Field(None, ge=1)
    max_concurrency: int | None = Field(None, ge=1)
    max_output_tokens: int = Field(4096, ge=1)  # default output cap when max_tokens is absent


class TenantConfig(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    api_keys: tuple[str, ...] = ()  # "sha256:<64 hex>"; `kvgate hash-key` prints one
    limits: TenantLimits = TenantLimits()
    priority: Literal["critical", "standard", "sheddable"] = "standard"
    weight: float = Field(1.0, gt=0)
    models: tuple[str, ...] | None = None  # allow-list; "base:*" means any adapter of base
    quotas: tuple[QuotaConfig, ...] = ()
    keys: tuple[KeyConfig, ...] = ()  # named keys (`api_keys` are keys without a name)
    slo: SloConfig = SloConfig()  # TTFT/TPOT objectives that tighten the latency gate

    @field_validator("api_keys")
    @classmethod
    def _hashed(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        for k in keys:
            check_key_hash(k)
        return keys

    @field_validator("quotas")
    @classmethod
    def _quota_names(cls, v: tuple[QuotaConfig, ...]) -> tuple[QuotaConfig, ...]:
        return unique_quota_names(v)

    @field_validator("keys")
    @classmethod
    def _unique_keys(cls, keys: tuple[KeyConfig, ...]) -> tuple[KeyConfig, ...]:
        names = [k.name for k in keys]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate key names {dup}")
        return keys

    def key_hashes(self) -> list[str]:
        return [*self.api_keys, *(k.hash for k in self.keys)]


class AuthConfig(_Strict):
    anonymous_tenant: str | None = None  # requests without a key run as this tenant
    # hashed like tenant keys; guards /admin/...; a plain hash or {name, hash}
    admin_keys: tuple[str | AdminKeyConfig, ...] = ()

    @field_validator("admin_keys")
    @classmethod
    def _admins(cls, keys: tuple[str | AdminKeyConfig, ...]) -> tuple[str | AdminKeyConfig, ...]:
        names = []
        for k in keys:
            if isinstance(k, str):
                check_key_hash(k)
            else:
                names.append(k.name)
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate admin key names {dup}")
        return keys


class StateConfig(_Strict):
    store: str = "memory://"  # or redis://host:port/db
    on_store_error: Literal["open", "closed"] = "open"
    timeout_s: float = Field(0.05, gt=0)
    key_prefix: str = "kvgate:"
    # kvgate instances (each `kvgate serve`, e.g. a pod) sharing the limits; each runs server.workers
    # processes, and each process enforces 1/(gateways x workers) of a concurrency limit, and of the
    # buckets while Redis is down (fail-open share).
    gateways: int = Field(1, ge=1)
    probe_min_s: float = Field(0.25, gt=0)  # while Redis is down: first re-probe after this...
    probe_max_s: float = Field(5.0, gt=0)  # ...doubling up to this
    # Keys and tenant changes made through the admin API reach the other gateways by pub/sub at once,
    # and by a resync this often if a message was lost (gateway/policy_sync.py).
    resync_interval_s: float = Field(5.0, gt=0)
    propagation_timeout_s: float = Field(2.0, ge=0)  # an admin change waits this long for every gateway

    @field_validator("store")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if not (v == "memory://" or v.startswith("redis://") or v.startswith("rediss://")):
            raise ValueError("must be 'memory://' or a redis:// URL")
        return v


class Config(_Strict):
    server: ServerConfig = ServerConfig()
    models: tuple[ModelConfig, ...] = ()
    replicas: tuple[ReplicaConfig, ...] = ()
    discovery: DiscoveryConfig = DiscoveryConfig()  # replicas that come and go (config_discovery.py)
    simulator: SimulatorConfig = SimulatorConfig()
    fleet: FleetConfig = FleetConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    scheduling: SchedulingConfig = SchedulingConfig()
    tenants: tuple[TenantConfig, ...] = ()
    auth: AuthConfig = AuthConfig()
    state: StateConfig = StateConfig()
    flow_control: FlowControlConfig = FlowControlConfig()
    ledger: LedgerConfig = LedgerConfig()
    routes: tuple[RouteConfig, ...] = ()  # A/B routing of models and adapters (gateway/config_routes.py)
    headroom: HeadroomConfig = HeadroomConfig()  # goodput headroom's SLOs (gateway/config_headroom.py)

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        names = [r.display_name for r in self.replicas]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"replicas: duplicate replica names {sorted(dup)}")
        tenants = [t.name for t in self.tenants]
        dup = {n for n in tenants if tenants.count(n) > 1}
        if dup:
            raise ValueError(f"tenants: duplicate tenant names {sorted(dup)}")
        keys = [k for t in self.tenants for k in t.key_hashes()]
        if len(keys) != len(set(keys)):
            raise ValueError("tenants: the same api key is given to more than one tenant")
        anon = self.auth.anonymous_tenant
        if anon is not None and anon not in tenants:
            raise ValueError(f"auth.anonymous_tenant: no tenant named {anon!r}")
        problems = route_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        problem = workers_problem(self, self.server.workers)
        if problem is not None:
            raise ValueError(problem)
        return self

    @property
    def limit_processes(self) -> int:
        """Processes that share the tenants' limits: `state.gateways` instances of `server.workers`
        processes each (with memory:// only this one)."""
        if self.state.store == "memory://":
            return 1
        return self.state.gateways * self.server.workers

    def model_settings(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        return ModelConfig(name=name)


def workers_problem(config: Config, workers: int) -> str | None:
    """Why `config` cannot run `workers` processes (None: it can)."""
    if workers > 1 and config.state.store == "memory://":
        return (
            f"server.workers: {workers} worker processes need state.store: redis://... to share the "
            "tenants' limits; with memory:// each process would keep its own buckets and counters, "
            f"multiplying every tenant's limits by {workers}"
        )
    return None


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{path}: {msg}")
    return "\n".join(lines)


def parse_config(data: Any, config_dir: str | Path | None = None) -> Config:
    """Validate already-loaded YAML data (None = empty file). Relative file paths in it are taken from
    `config_dir` (the config file's directory; None: the working directory)."""
    try:
        return Config.model_validate(data or {}, context={"config_dir": config_dir})
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file; raises ConfigError with every problem found."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{p}: cannot read: {err.strerror}") from None
    return config_from_text(text, str(p))


def config_from_text(text: str, source: str) -> Config:
    """Validate a config file's text; `source` (its path) prefixes the errors about the file as such."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {err}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    # The directory the path was given in, symlinks kept: a ConfigMap's file is a link into a
    # versioned folder that the next update replaces.
    return parse_config(data, Path(source).absolute().parent)
