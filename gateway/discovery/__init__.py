"""Where replicas come from besides the static list: a replicas file, DNS, Kubernetes.

Each source produces a whole desired set of `ReplicaSpec`s; the `Reconciler` merges them with the
static list and applies the result to `FleetState` (its one membership API, `apply`). `Discovery`
runs the configured sources.
"""

from gateway.discovery.reconciler import Reconciler, SourceStatus
from gateway.discovery.service import Discovery

__all__ = ["Discovery", "Reconciler", "SourceStatus"]
