"""kvgate's routing in virtual time: the gateway's own `Router` and `FleetState`, fed by simulated scrapes.

Nothing of the routing path is re-implemented here. The model builds the live gateway's objects from a
gateway `Config` and calls them as the live request path does (`gateway/proxy.py`):

- prompt facts: `Router.prompt_facts` (the canonical prompt's byte blocks, the live default); with the
  `sim` tokenizer configured, the same token-block keys the live `SimTokenizer` path makes, computed
  from the token ids the run already has instead of tokenizing the prompt a second time;
- the request's `RequestInfo` as `ProxyEndpoint._request_info` builds it (output cap = `max_tokens`,
  else the default tenant cap; session from the configured session header);
- `Router.decide(info, fleet.snapshot(), now)`, then on dispatch `FleetState.dispatched` (in-flight + 1,
  live) and `Router.dispatched` (prefix index record, session map), and at the end of the response
  `FleetState.finished`;
- the predicted-latency ledger as the proxy drives it (`gateway.latency_store.LatencyStore`): a ticket
  at dispatch, the first token's virtual time, the mean time per output token at the end;
- `FleetState.record_scrape` with the replica's engine stats at each simulated scrape, so between
  scrapes a `ReplicaState` holds the last scraped running/waiting/KV usage/adapters plus the
  gateway's live in-flight counts: exactly the live gateway's staleness. `FleetState` rebuilds only
  the changed replicas' states per snapshot, as it does live.
- what each scrape tells routing (the prefix index's per-replica capacity from the scraped cache
  size, the group ledger's real prefix-cache counters): `Router.observe_scrape`, as live.

Flow control, when the run models it (`DesConfig.flow_control`): the gateway's own `AdmissionQueue`
(gateway/admission.py, with the latency gate of `flow_control.predicted_admission`) over this
model's `FleetState`, called as `Tenancy.admit`/`settle` and the proxy call it: `admit` before routing
(the band from the tenant and `x-kvgate-priority`, the SLO from the tenant and `x-kvgate-ttft-slo-ms`),
`on_fleet_change` from the fleet's listener, `on_prefilled` at the first token, `leave` at the end.
Each request's tenant is the workload's tenant name (the DES does not authenticate), with that
tenant's `tenants[]` entry when the config has one (weight, band, SLO), else the defaults. The run
keeps the waits in virtual time (loadtests.des.simulation).

Not modelled: authentication, rate limits and quotas, health checks and failover (simulated replicas
never fail); without `flow_control`, flow control either (every request is routed at once).

Several gateway processes are several `GatewayModel`s over the same replicas (`loadtests.des.gateways`),
each with its own `Router` (prefix index, session map) and `FleetState` (in-flight ledger, scrapes).

Times are virtual seconds from the run's clock. One run owns its models; not thread-safe.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.admission import AdmissionQueue, Held
from gateway.config import Config, ReplicaConfig, TenantLimits, parse_config
from gateway.errors import GatewayError
from gateway.fleet.metrics_parse import ReplicaMetrics
from gateway.fleet.models_parse import ServedModels
from gateway.fleet.state import FleetChange, FleetState
from gateway.latency_store import LatencyStore
from gateway.metrics import GatewayMetrics
from gateway.request_parse import Endpoint
from gateway.routing import PromptFacts, Router
from gateway.tenancy import PRIORITY_HEADER, request_band, request_slo
from gateway.tenants import Tenant, TenantRegistry
from policies.exact_keys import pack_tokens
from policies.latency.estimator import Prediction
from policies.latency_admission import TTFT_SLO_HEADER
from policies.prefix import seed_for, token_block_keys
from policies.prefix_source import PrefixSource
from policies.types import RequestInfo
from simulator.engine import EngineStats

_DEFAULT_OUTPUT_CAP = TenantLimits().max_output_tokens
_ANONYMOUS = "anonymous"


class RouteError(Exception):
    """The gateway would answer this request with an error instead of routing it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Routed:
    """One routing decision: the winner's index (in `GatewayModel.names` order), the request as the
    policies saw it, the tokens counted in flight (prompt estimate + output cap), and the number of
    the gateway that decided it."""

    replica: int
    info: RequestInfo
    tokens: int
    matched_blocks: int  # leading index blocks the winner was believed to hold
    gateway: int = 0
    ticket: Prediction | None = None  # the latency model's prediction for it
    at: float = 0.0  # when it was dispatched (virtual seconds)


def gateway_config(
    base: Config | Mapping[str, Any] | None,
    names: Sequence[str],
    model: str,
    *,
    policy: str | None = None,
    tokenizer: str | None = None,
    scrape_interval_s: float | None = None,
    stale_after_s: float | None = None,
    seed: int | None = None,
    flow_control: bool = False,
    latency_prior: str | None = None,
) -> Config:
    """The gateway config of a simulated fleet: `base` (a `Config`, its YAML data, or None for the
    defaults) with its replicas replaced by `names` serving pool `model`, and the given overrides.

    Replica URLs are `http://<name>.des.invalid` (never contacted). `tokenizer` ("none" or "sim")
    applies to pool `model`; `latency_prior` (a simulator profile name) becomes its
    `models[].latency_prior` unless `base` gives one. Times are virtual seconds. Without
    `flow_control` (the run does not model it), `flow_control.predicted_admission` is turned off:
    the gate's routing side (the `latency-knee` filter) must not act without its admission side.
    """
    data: dict[str, Any]
    if isinstance(base, Config):
        data = base.model_dump(mode="json", exclude_none=False)
    else:
        data = dict(base or {})
    data["replicas"] = [{"url": f"http://{n}.des.invalid", "model": model, "name": n} for n in names]
    sched = dict(data.get("scheduling") or {})
    if policy is not None:
        sched["profile"] = policy
    if seed is not None:
        sched["seed"] = seed
    data["scheduling"] = sched
    fleet = dict(data.get("fleet") or {})
    if scrape_interval_s is not None:
        fleet["scrape_interval_s"] = scrape_interval_s
    if stale_after_s is not None:
        fleet["stale_after_s"] = stale_after_s
    data["fleet"] = fleet
    if not flow_control:
        # Flow control is not modelled (module docstring), so neither is the latency gate; with it off
        # the router's `latency-knee` filter is a no-op too, and routing is what it was before it.
        data["flow_control"] = {**dict(data.get("flow_control") or {}), "predicted_admission": False}
    if tokenizer is not None or latency_prior is not None:
        models = [dict(m) for m in data.get("models") or ()]
        entry = next((m for m in models if m.get("name") == model), None)
        if entry is None:
            entry = {"name": model}
            models.append(entry)
        if tokenizer is not None:
            entry["tokenizer"] = tokenizer
        if latency_prior is not None and entry.get("latency_prior") is None:
            # As `kvgate bench` configures its live gateway: the fleet's own speed is the pool's prior
            # (the latency model, the gate and `predicted-latency` start from it), unless `base` says.
            entry["latency_prior"] = {"profile": latency_prior}
        data["models"] = models
    return parse_config(data)


class GatewayModel:
    """The live gateway's routing state and decisions over simulated replicas (module docstring).

    `names` are the replicas in config order; `clock()` is the run's virtual clock; `rng` is the
    scheduling profile's random source (the live gateway seeds it from `scheduling.seed`). `index`
    replaces the router's own approximate prefix index (see `policies.prefix_source`); `number` names
    this gateway among several (`loadtests.des.gateways`). With `flow_control` (and the config's
    `flow_control.enabled`), `admission` is the gateway's admission queue, else None.
    """

    def __init__(self, config: Config, clock: Callable[[], float], rng: random.Random,
                 index: PrefixSource | None = None, number: int = 0,
                 flow_control: bool = False) -> None:  # fmt: skip
        self.config = config
        self.number = number
        self.routed = 0  # requests this gateway routed
        self.names: tuple[str, ...] = tuple(r.display_name for r in config.replicas)
        self._index_of = {name: i for i, name in enumerate(self.names)}
        self.fleet = FleetState(config.replicas, config.fleet, clock)
        self.router = Router(config, rng, index)
        self.latency = LatencyStore(self.router.latency)
        self._clock = clock
        self._session_header = config.scheduling.session_header.lower()
        self._token_blocks = {m.name for m in config.models if m.tokenizer == "sim"}
        self.admission: AdmissionQueue | None = None
        if flow_control and config.flow_control.enabled:
            fc = config.flow_control
            self.admission = AdmissionQueue(
                fc, config.fleet.stale_after_s, self.fleet, GatewayMetrics(), clock, self.router.latency
            )
        self._tenants = TenantRegistry(config)
        self.fleet.add_listener(self._on_fleet_change)

    @property
    def replicas(self) -> tuple[ReplicaConfig, ...]:
        return self.config.replicas

    # -- what the replicas tell the gateway ---------------------------------------------------------

    def serve_models(self, replica: int, base_model: str, adapters: Sequence[str]) -> None:
        """What replica `replica`'s `/v1/models` lists (polled once at start-up: it never changes)."""
        served = ServedModels(base_models=(base_model,), adapters={a: base_model for a in adapters})
        self.fleet.record_models(self.names[replica], served)

    def scrape(self, replica: int, stats: EngineStats) -> None:
        """A good `/metrics` scrape of `replica` whose engine reports `stats` now."""
        self.record_metrics(replica, replica_metrics(stats))

    def record_metrics(self, replica: int, metrics: ReplicaMetrics) -> None:
        """A good `/metrics` scrape of `replica` reaches the gateway now with `metrics` (perhaps read
        earlier: a scrape's delay)."""
        self.fleet.record_scrape(self.names[replica], metrics)

    def _on_fleet_change(self, replica: str, change: FleetChange) -> None:
        self.router.observe_scrape(self.fleet, replica, change)
        if self.admission is not None:
            self.admission.on_fleet_change(replica, change)

    # -- the request path -----------------------------------------------------------------------------

    def request_info(
        self,
        endpoint: str,
        body: Mapping[str, Any],
        *,
        prompt_ids: Sequence[int] | None = None,
        tenant: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> RequestInfo:
        """The request as the policies see it. `prompt_ids` are the simulator tokenizer's ids of the
        prompt (used for token-block keys when the pool has the `sim` tokenizer). Raises RouteError
        404 for a model the fleet does not serve."""
        model = body.get("model")
        resolved = self.fleet.pool_of(model) if isinstance(model, str) else None
        if resolved is None or not isinstance(model, str):
            raise RouteError(404, f"The model `{model}` does not exist.")
        base, adapter = resolved
        endpoint_kind: Endpoint = "chat" if endpoint == "chat" else "completions"
        if base in self._token_blocks and prompt_ids is not None:
            facts = _token_facts(prompt_ids, self.router.index_block_tokens, seed_for(base, adapter))
        else:
            facts = self.router.prompt_facts(endpoint_kind, body, base, adapter)
        cap = body.get("max_completion_tokens") if endpoint_kind == "chat" else None
        if cap is None:
            cap = body.get("max_tokens")
        max_tokens = cap if isinstance(cap, int) and cap > 0 else _DEFAULT_OUTPUT_CAP
        session = _header(headers, self._session_header) if headers else None
        return RequestInfo(
            model=model,
            base_model=base,
            adapter=adapter,
            prompt_tokens=facts.prompt_tokens,
            max_tokens=max_tokens,
            stream=bool(body.get("stream", False)),
            tenant=tenant or _ANONYMOUS,
            session_id=session,
            prefix_keys=facts.prefix_keys,
            prompt_tokens_exact=facts.exact,
            token_bytes=facts.token_bytes,
        )

    def admit(
        self, info: RequestInfo, wake: Callable[[GatewayError | None], bool],
        headers: Mapping[str, str] | None = None,
    ) -> Held | None:  # fmt: skip
        """Flow control for `info` (module docstring): None when it may be routed now (also when flow
        control is off), else its place in the queue: `wake` is called with None when it may go, or
        with the error it is refused with while waiting. Raises GatewayError as `Tenancy.admit`
        does (400 for a malformed `x-kvgate-priority` or `x-kvgate-ttft-slo-ms`, 429/503)."""
        admission = self.admission
        if admission is None:
            return None
        tenant = self._tenants.get(info.tenant) or Tenant(info.tenant)
        priority = _header(headers, PRIORITY_HEADER) if headers else None
        ttft_slo = _header(headers, TTFT_SLO_HEADER) if headers else None
        band = request_band(tenant, None if priority is None else priority.encode("latin-1"))
        slo = request_slo(tenant, None if ttft_slo is None else ttft_slo.encode("latin-1"))
        return admission.admit(
            info.base_model, tenant.name, tenant.weight, band, info.reserved_tokens, info.prompt_tokens,
            slo, info.prefix_keys, wake,
        )  # fmt: skip

    def prefilled(self, info: RequestInfo) -> None:
        """`info`'s first token came back (a capacity event for the latency gate)."""
        if self.admission is not None:
            self.admission.on_prefilled(info.base_model)

    def left(self, info: RequestInfo) -> None:
        """A request `admit` let through has ended, whatever the outcome (the tenant's settle)."""
        if self.admission is not None:
            self.admission.leave(info.base_model, info.tenant)

    def route(self, info: RequestInfo, now: float) -> Routed:
        """Decide and dispatch: the winner's in-flight count and prefix index are updated at once, as
        the forwarder's first attempt does. Pair with `finished(routed)`. RouteError 503 when no
        replica can serve."""
        routed = self.router.decide(info, self.fleet.snapshot(), now)
        ranked = routed.decision.ranked
        if not ranked:
            raise RouteError(503, "no replica can serve this model right now")
        winner = ranked[0].name
        tokens = info.reserved_tokens
        matched = routed.match.get(winner, 0)
        ticket = self.latency.dispatch(self.router.predict(info, ranked[0], matched, now))
        self.fleet.dispatched(winner, tokens)
        self.router.dispatched(info, winner)
        self.routed += 1
        return Routed(self._index_of[winner], info, tokens, int(matched), self.number, ticket, now)

    def step_seen(self, replica: int, now: float) -> None:
        """A chunk of a stream on `replica` reached the gateway now (a step there ended)."""
        self.router.latency.step_seen(self.names[replica], now)

    def first_token(self, routed: Routed, now: float) -> float | None:
        """`routed`'s first token reached the gateway now (as the proxy's first chunk). Returns the
        latency model's |predicted - actual| / actual TTFT for it (None: not scored)."""
        if routed.ticket is None:
            return None
        return self.latency.first_token(routed.ticket, now - routed.at)

    def count_dispatch(self, routed: Routed) -> None:
        """Another gateway's dispatch `routed`, counted in this gateway's ledger (a shared ledger);
        pair with `finished(routed)`. The prefix index does not learn from it."""
        self.fleet.dispatched(self.names[routed.replica], routed.tokens)

    def finished(self, routed: Routed, had_first_token: bool = True, tpot_s: float | None = None) -> None:
        """The response of `routed` ended (whatever the outcome): in-flight - 1; the latency ledger
        lets it go, and `tpot_s` (its mean seconds per output token) calibrates decode."""
        self.fleet.finished(self.names[routed.replica], routed.tokens)
        if routed.ticket is not None and routed.gateway == self.number:
            self.latency.ended(routed.ticket, had_first_token, tpot_s, self._clock())


def replica_metrics(stats: EngineStats) -> ReplicaMetrics:
    """What a `/metrics` scrape of an engine reporting `stats` gives the gateway."""
    return ReplicaMetrics(
        running=stats.num_running,
        waiting=stats.num_waiting,
        kv_usage=stats.kv_cache_usage,
        prefix_queries_tokens=stats.prefix_cache_queries_tokens,
        prefix_hits_tokens=stats.prefix_cache_hits_tokens,
        preemptions=stats.num_preemptions,
        block_size=stats.block_size,
        num_gpu_blocks=stats.num_gpu_blocks,
        max_loras=stats.max_loras or None,
        running_adapters=stats.running_adapters,
        waiting_adapters=stats.waiting_adapters,
    )


def _token_facts(ids: Sequence[int], block_tokens: int, seed: int) -> PromptFacts:
    # gateway.tokenizers.SimTokenizer folds the simulator's ids (up to 2**51) to 32 bits the same way.
    # The packed ids are what the Router's exact match hashes (`pack_tokens`, as the live path).
    folded = [(i ^ (i >> 32)) & 0xFFFFFFFF for i in ids]
    return PromptFacts(len(ids), True, token_block_keys(folded, block_tokens, seed), pack_tokens(folded))


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None
