"""What-if runs: the benchmark's workloads and kvgate's routing over a simulated fleet in virtual time.

`run_des(specs, DesConfig(FleetSpec(...)), LoadConfig(...))` -> `DesResult` (see `loadtests.des.run`).
"""

from loadtests.des.config import DesConfig
from loadtests.des.fleet import FleetSpec
from loadtests.des.outcome import DesResult, ReplicaReport
from loadtests.des.run import run_des
from loadtests.des.simulation import Simulation

__all__ = ["DesConfig", "DesResult", "FleetSpec", "ReplicaReport", "Simulation", "run_des"]
