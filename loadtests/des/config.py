"""`DesConfig`: the simulated fleet and the gateway in front of it, for one what-if run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.config import Config
from loadtests.des.fleet import FleetSpec
from loadtests.des.gateways import GatewayViews

AUTO_CHUNK_REQUESTS = 20_000
"""`record_chunks=None` keeps per-token chunk times when the run's request count is known (`max_requests`,
or the length of a list of specs) and at most this."""


@dataclass(frozen=True, slots=True)
class DesConfig:
    """A simulated fleet and the gateway in front of it.

    `policy` is a scheduling profile name of the gateway config (`default`, `round-robin`, ...).
    `gateway` is a gateway `Config` (or its YAML data) whose scheduling, prefix index, fleet and
    models settings apply; its replicas are replaced by the simulated ones. `tokenizer` ("none" or
    "sim") and `scrape_interval_s` / `stale_after_s` (virtual seconds) override it when set.
    `record_chunks`: keep every token time in the traces (None: when the run's request count is known
    and at most `AUTO_CHUNK_REQUESTS`; see `loadtests.des.traces`). `seed` seeds routing ties,
    scrape phases and the spread of requests over gateways. `views`: how many gateways stand in
    front of the fleet and what each sees (`loadtests.des.gateways`; one gateway by default).
    `flow_control`: each gateway admits requests through its own admission queue and latency gate
    as configured (`gateway.flow_control`; off: every request is routed the moment it arrives, and
    the gate's routing side is off too; `loadtests.des.gateway_model`).
    """

    fleet: FleetSpec
    policy: str = "default"
    gateway: Config | Mapping[str, Any] | None = None
    tokenizer: str | None = None
    scrape_interval_s: float | None = None
    stale_after_s: float | None = None
    gateway_overhead_s: float = 0.0
    record_chunks: bool | None = None
    seed: int = 0
    views: GatewayViews = field(default_factory=GatewayViews)
    flow_control: bool = False

    def __post_init__(self) -> None:
        if self.gateway_overhead_s < 0:
            raise ValueError(f"gateway_overhead_s must be >= 0, got {self.gateway_overhead_s}")
