"""Seeded, reproducible workload generators, one module per workload type.

Each workload yields `RequestSpec`s (see `spec.py` for the contract, including the session sequencing
the runner honours) and describes itself for the report. `WORKLOAD_TYPES` names them by the kebab-case
type name used on the command line and in results.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from loadtests.workloads.lora_mix import LoraMixWorkload, zipf_weights
from loadtests.workloads.multi_turn import MultiTurnWorkload
from loadtests.workloads.noisy_neighbour import DEFAULT_TENANTS, NoisyNeighbourWorkload, TenantShare
from loadtests.workloads.random_prompts import RandomWorkload
from loadtests.workloads.shared_prefix import PrefixSizing, SharedPrefixWorkload, size_shared_prefix
from loadtests.workloads.spec import ENDPOINT_PATHS, Endpoint, RequestSpec, Workload

WORKLOAD_TYPES: Mapping[str, type] = MappingProxyType(
    {
        SharedPrefixWorkload.name: SharedPrefixWorkload,
        MultiTurnWorkload.name: MultiTurnWorkload,
        LoraMixWorkload.name: LoraMixWorkload,
        NoisyNeighbourWorkload.name: NoisyNeighbourWorkload,
        RandomWorkload.name: RandomWorkload,
    }
)

__all__ = [
    "DEFAULT_TENANTS",
    "ENDPOINT_PATHS",
    "WORKLOAD_TYPES",
    "Endpoint",
    "LoraMixWorkload",
    "MultiTurnWorkload",
    "NoisyNeighbourWorkload",
    "PrefixSizing",
    "RandomWorkload",
    "RequestSpec",
    "SharedPrefixWorkload",
    "TenantShare",
    "Workload",
    "size_shared_prefix",
    "zipf_weights",
]
