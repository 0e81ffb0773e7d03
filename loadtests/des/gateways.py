"""N kvgate processes in front of one simulated fleet, each with its own view of it.

A real deployment runs several gateway processes (`kvgate serve` instances or workers). Each keeps its
own picture of the fleet, built by the live gateway's own objects (`gateway_model.GatewayModel`: a
`Router` with its prefix index and session map, a `FleetState` with its in-flight ledger):

- its prefix index: with the approximate index (the live default) it learns only from what this
  gateway itself routed, so gateway 2 does not know where gateway 1 sent a prefix;
- its dispatch ledger: the in-flight counts it knows are its own dispatches (`ledger="local"`, as
  live), or every gateway's at once (`ledger="shared"`: what sharing dispatch counts instantly would
  give; a what-if, not a live mode);
- the replicas' `/metrics`: the same engines for everyone, each gateway scraping every replica every
  `scrape_interval_s` (x U(0.9, 1.1)) at its own random phases (`scrape_phases="independent"`, as N
  processes do) or all at the same instants (`"aligned"`), each scrape's numbers reaching the
  gateway `scrape_delay_s` after the replica produced them;
- the index: `index="approximate"` (the live default: the router's own `PrefixIndex`, learning from
  this gateway's dispatches only), or `index="exact"`: the engines record their KV events and every
  gateway applies each replica's batches to its own `ExactIndex` `event_lag_s` after the step that
  made them ended (`loadtests.des.exact_events`); the Router matches replicas in exact mode on it as
  live. All gateways then hold the same picture. Exact needs the `sim` tokenizer (the live exact
  path needs a tokenizer too); `event_lag_s` applies only to it.

Requests reach the gateways round robin or at random (seeded): the load balancer in front.

`Gateways` owns the models and their scrape schedules and keeps the fleet's true in-flight count per
replica (every gateway's dispatches), from which the run measures herding. Times are virtual seconds;
owned by one `Simulation`; not thread-safe.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.config import Config
from gateway.fleet.metrics_parse import ReplicaMetrics
from gateway.kv_events.wire import EventBatch
from loadtests.des.events import EventQueue
from loadtests.des.exact_events import DesExactSource, event_batch
from loadtests.des.fleet import SimReplica
from loadtests.des.gateway_model import GatewayModel, Routed, replica_metrics
from policies.prefix_source import PrefixSource

SPREADS = ("round-robin", "random")
SCRAPE_PHASES = ("independent", "aligned")
LEDGERS = ("local", "shared")
INDEX_SOURCES = ("approximate", "exact")
DEFAULT_EVENT_LAG_S = 0.005
ALL = -1  # a scrape event's gateway when every gateway takes it (aligned phases)


@dataclass(frozen=True, slots=True)
class GatewayViews:
    """How many gateways, how requests reach them, and what each one sees (module docstring)."""

    gateways: int = 1
    spread: str = "round-robin"
    scrape_delay_s: float = 0.0
    scrape_phases: str = "independent"
    ledger: str = "local"
    index: str = "approximate"
    event_lag_s: float = DEFAULT_EVENT_LAG_S  # exact index only

    def __post_init__(self) -> None:
        if self.gateways < 1:
            raise ValueError(f"gateways must be >= 1, got {self.gateways}")
        for field, value, known in (("spread", self.spread, SPREADS),
                                    ("scrape_phases", self.scrape_phases, SCRAPE_PHASES),
                                    ("ledger", self.ledger, LEDGERS)):  # fmt: skip
            if value not in known:
                raise ValueError(f"{field} must be one of {', '.join(known)}, got {value!r}")
        if self.index not in INDEX_SOURCES:
            raise ValueError(f"index must be one of {', '.join(INDEX_SOURCES)}, got {self.index!r}")
        if self.scrape_delay_s < 0:
            raise ValueError(f"scrape_delay_s must be >= 0, got {self.scrape_delay_s}")
        if not self.event_lag_s >= 0 or self.event_lag_s == float("inf"):
            raise ValueError(f"event_lag_s must be a finite number >= 0, got {self.event_lag_s}")

    @property
    def exact(self) -> bool:
        return self.index == "exact"

    def index_source(self) -> PrefixSource | None:
        """A fresh approximate index source for one gateway; None = the router's own `PrefixIndex`
        (built from `scheduling.prefix_index`, exactly as live). The exact index comes on top of it,
        as live: replicas not in exact mode are matched on the approximate one."""
        return None


class Gateways:
    """The run's gateways over its replicas (module docstring). `models[k]` is gateway k; `in_flight`
    the true in-flight count per replica (all gateways' dispatches not yet finished).

    Scrape events are `(scrape_kind, (gateway or ALL, replica))`; with a delay, the numbers arrive in
    `(apply_kind, (gateway or ALL, replica, metrics))`.
    """

    def __init__(self, views: GatewayViews, config: Config, queue: EventQueue, replicas: Sequence[SimReplica],
                 seed: int, scrape_kind: int, apply_kind: int,
                 flow_control: bool = False) -> None:  # fmt: skip
        self.views = views
        self.queue = queue
        self.replicas = replicas
        self.models = [
            GatewayModel(
                config,
                queue.clock,
                random.Random(_seed("des-route", seed, k)),
                index=views.index_source(),
                number=k,
                flow_control=flow_control,
            )
            for k in range(views.gateways)
        ]
        self.exact: list[DesExactSource] = []
        if views.exact:
            stats = replicas[0].engine.stats
            stale = config.scheduling.prefix_index.events_stale_after_s
            names = self.models[0].names
            for model in self.models:
                source = DesExactSource(names, config.replicas[0].model, stats.num_gpu_blocks,
                                        stats.block_size, stale, queue.clock)  # fmt: skip
                model.router.exact = source
                self.exact.append(source)
        self._event_seq = [0] * len(replicas)
        self.in_flight = [0] * len(replicas)
        self.total_in_flight = 0
        self.scrape_interval = config.fleet.scrape_interval_s
        schedules = 1 if views.scrape_phases == "aligned" else views.gateways
        self._scrape_rngs = [random.Random(_seed("des-scrape", seed, k)) for k in range(schedules)]
        self._spread_rng = random.Random(f"des-spread:{seed}")
        self._turn = 0
        self._shared = views.ledger == "shared" and views.gateways > 1
        self._metrics: list[ReplicaMetrics | None] = [None] * len(replicas)
        self._scraping = False
        self._kinds = (scrape_kind, apply_kind)

    # -- requests ---------------------------------------------------------------------------------

    def pick(self) -> GatewayModel:
        """The gateway the load balancer hands the next request to."""
        models = self.models
        if len(models) == 1:
            return models[0]
        if self.views.spread == "random":
            return models[int(self._spread_rng.random() * len(models))]
        self._turn += 1
        return models[self._turn % len(models)]

    def dispatched(self, routed: Routed) -> None:
        """`routed` went out (its gateway already counted it): the true count, and a shared ledger."""
        self.in_flight[routed.replica] += 1
        self.total_in_flight += 1
        if self._shared:
            for model in self.models:
                if model.number != routed.gateway:
                    model.count_dispatch(routed)

    def step_seen(self, replica: int, now: float) -> None:
        """A step of `replica` produced tokens now: every gateway relaying a stream there sees it."""
        for model in self.models:
            model.step_seen(replica, now)

    def first_token(self, routed: Routed, now: float) -> float | None:
        """`routed`'s first token came back now (its gateway's latency model observes it); the
        model's TTFT error for it (`GatewayModel.first_token`)."""
        return self.models[routed.gateway].first_token(routed, now)

    def finished(self, routed: Routed, had_first_token: bool = True, tpot_s: float | None = None) -> None:
        """The response of `routed` ended, whatever the outcome."""
        self.models[routed.gateway].finished(routed, had_first_token, tpot_s)
        self.in_flight[routed.replica] -= 1
        self.total_in_flight -= 1
        if self._shared:
            for model in self.models:
                if model.number != routed.gateway:
                    model.finished(routed)

    def skew(self) -> float:
        """The busiest replica's true in-flight count above the fleet's mean, in requests."""
        return max(self.in_flight) - self.total_in_flight / len(self.in_flight)

    # -- KV events (exact index) -----------------------------------------------------------------

    def publish_events(self, replica: int, end: float, events_kind: int) -> None:
        """Replica `replica`'s recorded KV events (taken now, when one of its steps starts or ends) are
        published at `end` and reach every gateway `event_lag_s` later."""
        events = self.replicas[replica].engine.take_kv_events()
        if not events:
            return
        seq = self._event_seq[replica]
        self._event_seq[replica] = seq + 1
        self.queue.push(end + self.views.event_lag_s, events_kind, (replica, event_batch(seq, end, events)))

    def receive_events(self, replica: int, batch: EventBatch) -> None:
        """A replica's event batch reaches every gateway now."""
        name, now = self.replicas[replica].name, self.queue.now
        for source in self.exact:
            source.receive(name, batch, now)

    # -- scrapes ----------------------------------------------------------------------------------

    def start(self, model_name: str, adapters: Sequence[str]) -> None:
        """Before the first request: every gateway lists every replica's models and scrapes it once
        (as `FleetScraper.start()` does), then the periodic scrapes start at evenly spread random
        phases, one schedule per gateway (one for all with aligned phases)."""
        if self._scraping:
            return
        self._scraping = True
        for model in self.models:
            for rep in self.replicas:
                model.serve_models(rep.index, model_name, adapters)
                model.record_metrics(rep.index, self._read(rep.index))
        queue, n, interval = self.queue, len(self.replicas), self.scrape_interval
        for k, rng in enumerate(self._scrape_rngs):
            who = ALL if self.views.scrape_phases == "aligned" else k
            for i in range(n):
                queue.push(queue.now + interval * (i + rng.random()) / n, self._kinds[0], (who, i))

    def scrape(self, who: int, replica: int) -> None:
        """A scrape of `replica` by gateway `who` (ALL: every gateway) now; the next is scheduled."""
        queue = self.queue
        metrics = self._read(replica)
        delay = self.views.scrape_delay_s
        if delay:
            queue.push(queue.now + delay, self._kinds[1], (who, replica, metrics))
        else:
            self.apply(who, replica, metrics)
        rng = self._scrape_rngs[0 if who == ALL else who]
        queue.push(queue.now + self.scrape_interval * rng.uniform(0.9, 1.1), self._kinds[0], (who, replica))

    def apply(self, who: int, replica: int, metrics: ReplicaMetrics) -> None:
        """Scraped numbers reach gateway `who` (ALL: every gateway)."""
        if who == ALL:
            for model in self.models:
                model.record_metrics(replica, metrics)
        else:
            self.models[who].record_metrics(replica, metrics)

    def engine_changed(self, replica: int) -> None:
        """The replica's engine moved (a step started, a request was aborted): its next scrape reads
        fresh numbers. Between such moves every scrape of it sees the same numbers, read once."""
        self._metrics[replica] = None

    def _read(self, replica: int) -> ReplicaMetrics:
        metrics = self._metrics[replica]
        if metrics is None:
            metrics = self._metrics[replica] = replica_metrics(self.replicas[replica].engine.stats)
        return metrics


def _seed(name: str, seed: int, gateway: int) -> str:
    # Gateway 0 keeps the single-gateway run's seeds, so `gateways=1` runs are unchanged.
    return f"{name}:{seed}" if gateway == 0 else f"{name}:{seed}:{gateway}"
