"""Goodput headroom per pool, live: the request mix kvgate observes, the metrics and the admin view.

The formula is pure (`policies.latency.headroom`). This keeps what it needs that only the request
path sees, each pool's request mix (an EWMA of finished requests' prompt, uncached and output
tokens, fed by gateway/proxy.py when an answer's usage is known), and computes the headroom from the
Router's latency models and the fleet snapshot when asked: on each /metrics scrape
(`kvgate_pool_goodput_headroom_requests_per_second{pool}`,
`kvgate_pool_goodput_headroom_tokens_per_second{pool,kind}` with kind prompt or output,
`kvgate_pool_goodput_headroom_ratio{pool}`, headroom / capacity) and on
`GET /admin/pools`. Nothing is computed per request.

The SLOs are `headroom_slos(config)` (gateway/config_headroom.py) of the config in force at the time
of asking; the mix before a pool's first answer is `headroom.default_*_tokens`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.config import Config
from gateway.config_headroom import headroom_slos
from gateway.fleet.state import FleetState
from policies.latency.estimator import LatencyEstimator
from policies.latency.headroom import PoolHeadroom, RequestMix, pool_headroom
from policies.latency.replica_model import ReplicaLatencyModel

RPS_METRIC = "kvgate_pool_goodput_headroom_requests_per_second"
TPS_METRIC = "kvgate_pool_goodput_headroom_tokens_per_second"
RATIO_METRIC = "kvgate_pool_goodput_headroom_ratio"


class PoolHeadroomView:
    """One per Gateway. `config()` is the config in force; `estimator` the Router's latency models."""

    def __init__(
        self,
        config: Callable[[], Config],
        fleet: FleetState,
        estimator: Callable[[], LatencyEstimator],
        clock: Callable[[], float],
        queued: Callable[[str], int] = lambda pool: 0,
    ) -> None:
        self._queued = queued  # a pool's requests waiting at the gateway (admission's queue)
        self._config = config
        self._fleet = fleet
        self._estimator = estimator
        self._clock = clock
        self._mixes: dict[str, RequestMix] = {}

    def observe(self, pool: str, prompt: int, uncached: int, output: int) -> None:
        """A request in `pool` ended with these token counts (from its usage)."""
        mix = self._mixes.get(pool)
        if mix is None:
            mix = self._mixes[pool] = RequestMix(self._config().headroom.default_mix())
        mix.observe(prompt, uncached, output)

    def mix_samples(self, pool: str) -> int:
        mix = self._mixes.get(pool)
        return 0 if mix is None else mix.count

    def pools(self, slope_sigmas: float = 1.0) -> list[PoolHeadroom]:
        """Every pool of the fleet snapshot's headroom now, in the order pools first appear
        (`slope_sigmas`: `policies.latency.headroom`'s extrapolation margin; benchmarks vary it)."""
        config = self._config()
        slos = headroom_slos(config)
        est = self._estimator()
        snapshot = self._fleet.snapshot()
        now = self._clock()
        names = list(dict.fromkeys(r.pool for r in snapshot.replicas if r.pool))
        default_mix = config.headroom.default_mix()
        out = []
        for pool in names:
            mix = self._mixes.get(pool)
            out.append(
                pool_headroom(
                    pool,
                    snapshot.replicas,
                    est.models(),
                    ReplicaLatencyModel(est.priors.get(pool, est.default_prior)),
                    default_mix if mix is None else mix.mix,
                    slos,
                    now,
                    config.fleet.stale_after_s,
                    slope_sigmas,
                    self._queued(pool),
                )
            )
        return out

    def collect(self) -> Iterable[Metric]:
        """The headroom gauges (a metrics callback: computed at scrape time)."""
        rps = GaugeMetricFamily(
            RPS_METRIC,
            "Requests/s the pool could take on top of its current load while meeting the headroom "
            "SLOs, from each replica's calibrated latency model (negative: over).",
            labels=["pool"],
        )
        tps = GaugeMetricFamily(
            TPS_METRIC,
            "The requests/s headroom in tokens/s at the pool's observed request mix, by kind "
            "(prompt, output).",
            labels=["pool", "kind"],
        )
        ratio = GaugeMetricFamily(
            RATIO_METRIC,
            "Goodput headroom as a share of the pool's SLO capacity: 1 idle, 0 at the knee, negative "
            "past it (-1: no capacity). 1 - this is the pool's utilisation for an autoscaler.",
            labels=["pool"],
        )
        for p in self.pools():
            rps.add_metric([p.pool], p.headroom_rps)
            ratio.add_metric([p.pool], p.ratio)
            tps.add_metric([p.pool, "prompt"], p.prompt_tokens_per_s)
            tps.add_metric([p.pool, "output"], p.output_tokens_per_s)
        yield rps
        yield tps
        yield ratio

    def summary(self) -> list[dict[str, Any]]:
        """Every pool as `GET /admin/pools` shows it."""
        slos = headroom_slos(self._config())
        out = []
        for p in self.pools():
            out.append(
                {
                    "pool": p.pool,
                    "slo": {"ttft_s": slos.ttft_s, "tpot_s": slos.tpot_s},
                    "mix": {
                        "prompt_tokens": p.mix.prompt_tokens,
                        "uncached_tokens": p.mix.uncached_tokens,
                        "output_tokens": p.mix.output_tokens,
                        "samples": self.mix_samples(p.pool),
                    },
                    "goodput_headroom": {
                        "requests_per_second": p.headroom_rps,
                        "prompt_tokens_per_second": p.prompt_tokens_per_s,
                        "output_tokens_per_second": p.output_tokens_per_s,
                        "ratio": p.ratio,
                    },
                    "capacity_requests_per_second": p.capacity_rps,
                    "load_requests_per_second": p.load_rps,
                    "backlog_requests_per_second": p.backlog_rps,
                    "replicas": [
                        {
                            "name": r.replica,
                            "busy": r.busy,
                            "capacity_requests_per_second": r.capacity_rps,
                            "load_requests_per_second": r.load_rps,
                            "headroom_requests_per_second": r.headroom_rps,
                        }
                        for r in p.replicas
                    ],
                }
            )
        return out
