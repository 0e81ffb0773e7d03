"""What a request the admission queue (gateway/admission.py) will not take is answered: 503 `fleet
overloaded`, or 429 for the tenant's own queue limit, each with a Retry-After.

Retry-After is the work ahead of the request in its pool's queue (its band and those above, plus
itself) at the pool's observed drain rate (policies/retry_after), or, when the latency gate held the
request, the predicted seconds until a replica would take it (policies/latency_admission); with
neither known, `retry_after_fallback_s`. A refusal while kvgate drains is gateway/drain.py's.
"""

from __future__ import annotations

from typing import Literal

from gateway.admission_pools import Pool
from gateway.config import FlowControlConfig
from gateway.errors import GatewayError
from policies.latency_admission import retry_after_from_drain
from policies.retry_after import retry_after_from_queue
from policies.types import Band

# Each is also its `reason` label in kvgate_rejections_total (gateway/metrics.py).
Reason = Literal["shed", "queue_full", "tenant_queue_full", "queue_timeout"]


def refusal(
    p: Pool,
    band: Band,
    tenant: str,
    now: float,
    reason: Reason,
    cfg: FlowControlConfig,
    max_wait_s: float,
    drain_s: float | None = None,
) -> GatewayError:
    """The error for a request of `tenant` in `band` refused for `reason` at `now`. `max_wait_s`: its
    band's; `drain_s`: the latency gate held the request, this many seconds from fitting."""
    fallback = cfg.retry_after_fallback_s
    if drain_s is not None:
        retry = retry_after_from_drain(drain_s, fallback_s=fallback)
    else:
        ahead = p.queue.work_ahead(band).requests + 1
        retry = retry_after_from_queue(ahead, p.drain.requests_per_s(now), fallback_s=fallback)
    headers = ((b"retry-after", str(retry).encode()),)
    if reason == "tenant_queue_full":
        return GatewayError(
            429,
            f"Too many requests of tenant '{tenant}' are waiting for capacity "
            f"(limit {cfg.max_queue_per_tenant}). Please try again in {retry}s.",
            code="queue_limit_exceeded",
            headers=headers,
        )
    detail = {
        "shed": f"{band.label} requests are not queued while the fleet is saturated",
        "queue_full": "the admission queue is full",
        "queue_timeout": f"no capacity freed up within {max_wait_s:g}s",
    }[reason]
    return GatewayError(503, f"fleet overloaded: {detail}. Please try again in {retry}s.", headers=headers)
