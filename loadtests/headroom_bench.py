"""Goodput headroom (issue #11): does the headroom kvgate reports at a low load predict the knee?

On a simulated fleet in virtual time (`loadtests.des`: the gateway's own `Router`, latency models
and `gateway.pool_headroom.PoolHeadroomView`, the simulator's engines), for each seed:

- predicted: at each low load (open loop, Poisson), the pool's headroom is read once per virtual
  second in the run's second half (after calibration) as the gateway would export it; the predicted
  knee is the offered rate + the median headroom;
- measured: the same workload at a sweep of rates, each on a fresh fleet; goodput = requests that met
  both SLOs (`loadtests.measures`, TTFT and mean TPOT per request) per second. The measured knee is
  the rate at which goodput / offered rate first falls below `--attain` (0.9), interpolated linearly
  between the two sweep points around it.

    python -m loadtests.headroom_bench --seeds 0,1 --low 4,8,16 --sweep 10:60:5

Bounded: ~1-2 s of CPU per virtual minute at these rates; the default run takes a few minutes.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.pool_headroom import PoolHeadroomView
from loadtests.des.config import DesConfig
from loadtests.des.fleet import FleetSpec
from loadtests.des.simulation import Simulation
from loadtests.measures import RequestTrace
from loadtests.runner import LoadConfig
from loadtests.slo import Slo
from loadtests.workloads.random_prompts import RandomWorkload

REPLICAS = 2
PROFILE = "llama-3-8b-h100"
PROMPT_TOKENS = 1000
OUTPUT_TOKENS = 200
JITTER = 0.3
TTFT_SLO_S = 0.5
TPOT_SLO_S = 0.03
DURATION_S = 60.0
WARMUP_S = 10.0


@dataclass(frozen=True, slots=True)
class Prediction:
    seed: int
    rate: float
    headroom_rps: float
    capacity_rps: float
    load_rps: float
    fit_headroom_rps: float  # with the fits' own slopes (no extrapolation margin)

    @property
    def knee(self) -> float:
        return self.rate + self.headroom_rps

    @property
    def fit_knee(self) -> float:
        return self.rate + self.fit_headroom_rps


def _sim(seed: int) -> tuple[Simulation, RandomWorkload]:
    fleet = FleetSpec(replicas=REPLICAS, profile=PROFILE)
    config = {"headroom": {"ttft_slo_s": TTFT_SLO_S, "tpot_slo_s": TPOT_SLO_S}}
    sim = Simulation(DesConfig(fleet, policy="default", gateway=config, seed=seed))
    workload = RandomWorkload(
        requests=100_000, prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS, model=fleet.model_name,
        length_jitter=JITTER, output_jitter=JITTER, seed=seed,
    )  # fmt: skip
    return sim, workload


def _load(rate: float, seed: int) -> LoadConfig:
    return LoadConfig(rate=rate, duration_s=DURATION_S, warmup_s=WARMUP_S, seed=seed, drain_timeout_s=30.0)


def predict(seed: int, rate: float) -> Prediction:
    sim, workload = _sim(seed)
    gw = sim.gateway
    view = PoolHeadroomView(lambda: gw.config, gw.fleet, lambda: gw.router.latency, lambda: sim.queue.now)
    pool = sim.config.fleet.model_name

    def done(t: RequestTrace) -> None:  # the proxy's feed of the pool's mix, from usage
        if t.ok and t.prompt_tokens:
            cached = t.cached_tokens or 0
            view.observe(pool, t.prompt_tokens, t.prompt_tokens - cached, t.output_tokens)

    sim.begin(workload.requests(), _load(rate, seed), on_done=done)
    samples = []
    fit = []
    next_at = DURATION_S / 2
    while sim.step():
        if sim.queue.now >= next_at and next_at <= DURATION_S:
            (p,) = view.pools()
            samples.append(p)
            fit.append(view.pools(slope_sigmas=0.0)[0].headroom_rps)
            next_at += 1.0
    sim.finish()
    return Prediction(
        seed, rate,
        statistics.median(p.headroom_rps for p in samples),
        statistics.median(p.capacity_rps for p in samples),
        statistics.median(p.load_rps for p in samples),
        statistics.median(fit),
    )  # fmt: skip


def attainment(seed: int, rate: float) -> float:
    sim, workload = _sim(seed)
    result = sim.run(workload.requests(), _load(rate, seed))
    return result.summarize(Slo(ttft_s=TTFT_SLO_S, tpot_s=TPOT_SLO_S)).goodput_rps / rate


def knee(points: Sequence[tuple[float, float]], attain: float) -> float | None:
    """The rate where goodput / offered first falls below `attain`, interpolated (None: never)."""
    for (r0, a0), (r1, a1) in itertools.pairwise(points):
        if a0 >= attain > a1:
            return r0 + (r1 - r0) * (a0 - attain) / (a0 - a1)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.headroom_bench", description=__doc__.splitlines()[0]
    )
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--low", default="4,8,16", help="low loads (requests/s) the headroom is read at")
    p.add_argument("--sweep", default="10:60:5", help="start:stop:step of the measured rates (requests/s)")
    p.add_argument("--attain", type=float, default=0.9)
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    lows = [float(r) for r in args.low.split(",")]
    start, stop, step = (float(x) for x in args.sweep.split(":"))
    rates = [start + i * step for i in range(int((stop - start) / step) + 1)]
    print(f"{REPLICAS}x {PROFILE}, random prompts {PROMPT_TOKENS}±{JITTER:.0%} tokens, output "
          f"{OUTPUT_TOKENS}±{JITTER:.0%}, SLO TTFT {TTFT_SLO_S}s TPOT {TPOT_SLO_S * 1e3:g}ms, "
          f"{DURATION_S:g}s per point (virtual)")  # fmt: skip
    print("| seed | measured knee (rps) | low load (rps) | reported headroom (rps) | capacity (rps) "
          "| predicted knee (rps) | predicted / measured | no margin: knee, / measured |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for seed in seeds:
        points = [(r, attainment(seed, r)) for r in rates]
        print(f"seed {seed} attainment: " + ", ".join(f"{r:g}:{a:.2f}" for r, a in points), file=sys.stderr)
        measured = knee(points, args.attain)
        for low in lows:
            pr = predict(seed, low)
            ratio = f"{pr.knee / measured:.2f}" if measured else "-"
            fit_ratio = f"{pr.fit_knee:.1f}, {pr.fit_knee / measured:.2f}" if measured else "-"
            shown = f"{measured:.1f}" if measured else "none in sweep"
            print(f"| {seed} | {shown} | {low:g} | {pr.headroom_rps:.1f} | {pr.capacity_rps:.1f} | "
                  f"{pr.knee:.1f} | {ratio} | {fit_ratio} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
