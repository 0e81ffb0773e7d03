"""Who is asking, and may they go now: authentication, allow-lists, rate limits, flow control.

This is the seam between the proxy and tenant policy. Without tenants in the config every request
runs as the anonymous tenant with no limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.config import Config
from gateway.sse_filter import Usage
from policies.types import Band, RequestInfo

ANONYMOUS = "anonymous"


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    band: Band = Band.STANDARD
    weight: float = 1.0
    max_output_tokens: int = 4096


@dataclass(slots=True)
class Admitted:
    """A request that may be dispatched; `settle` must be called exactly once when it ends."""

    info: RequestInfo
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    vllm_priority: int | None = None


class Tenancy:
    def __init__(self, config: Config) -> None:
        self._anonymous = Tenant(ANONYMOUS)
        self._config = config

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def on_fleet_change(self, replica: str, change: object) -> None:
        return None

    def authenticate(self, authorization: bytes | None) -> Tenant:
        return self._anonymous

    def check_model(self, tenant: Tenant, model: str) -> None:
        return None

    def default_max_tokens(self, tenant: str) -> int:
        return self._anonymous.max_output_tokens

    async def admit(self, tenant: Tenant, info: RequestInfo, priority: bytes | None) -> Admitted:
        return Admitted(info=info)

    async def settle(self, admitted: Admitted, usage: Usage | None, outcome: Any) -> None:
        return None
