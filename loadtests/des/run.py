"""`run_des`: one load point of a workload on a simulated fleet, in virtual time (the what-if mode).

    result = run_des(workload.requests(), DesConfig(FleetSpec(replicas=256)), LoadConfig(concurrency=2048,
                     duration_s=float("inf"), max_requests=100_000))
    result.summarize(slo)                      # loadtests.measures.Measures
    result.to_record(workload="shared-prefix") # a results.json record (+ driver/des keys)

See `loadtests.des.simulation` for what is simulated and how, `loadtests.des.outcome` for the result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from loadtests.des.config import DesConfig
from loadtests.des.outcome import DesResult
from loadtests.des.simulation import Simulation
from loadtests.measures import RequestTrace
from loadtests.runner import LoadConfig
from loadtests.workloads.spec import RequestSpec


def run_des(
    specs: Iterable[RequestSpec],
    config: DesConfig,
    load: LoadConfig,
    *,
    on_done: Callable[[RequestTrace], None] | None = None,
) -> DesResult:
    """Simulate one load point of `specs` on `config`'s fleet (see the module docstring).

    `load` is read as the live runner reads it, its seconds virtual (`duration_s` may be
    `float("inf")`: then the run ends when the workload or `max_requests` does). `on_done` is called
    with each trace as its request ends (a progress bar; keep it cheap). Deterministic: equal inputs
    give equal traces.
    """
    return Simulation(config).run(specs, load, on_done=on_done)
