"""Latency SLOs and the predicted-latency admission gate's settings (issue #11).

- `tenants[].slo: {ttft_s, tpot_s}` and `flow_control.bands.<band>.{ttft_slo_s, tpot_slo_s}`: seconds,
  optional; each only tightens the gate (policies/latency_admission), as does a request's
  `x-kvgate-ttft-slo-ms` header.
- `flow_control.predicted_admission`: the gate on (the default) or off; `flow_control.knee_factor`
  (> 1): with no SLO, a request is sent while its predicted TTFT on a replica stays within this many
  times its TTFT there unloaded (and always within that + one decode step of the batch running there,
  the step under way, which a hold cannot shorten); `flow_control.solo_knee_factor`: the knee while at
  most one tenant is active in the pool (the larger of the two applies then; set it to `knee_factor`
  for one knee throughout); `flow_control.light_knee_factor`: the knee of a tenant below its fair
  share while another is above its own (the larger of it and `knee_factor` applies), a latency reserve
  the heavy tenant, held at `knee_factor`, cannot use; `flow_control.light_reserve` (>= 0, requests; 1
  by default): while such a light tenant is active, the heavy one also leaves this many requests' room
  at the light knee to the light ones (at most the pool's replicas less one); 0 turns that part off.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from policies.latency_admission import LatencySlo

DEFAULT_KNEE_FACTOR = 1.25  # measured: docs/benchmarks.md, "Admission on predicted latency"
DEFAULT_SOLO_KNEE_FACTOR = 1.5  # the same section: one tenant alone is not held below this
DEFAULT_LIGHT_KNEE_FACTOR = 1.5  # the same section, "Third round": a light tenant's reserve above the knee
DEFAULT_LIGHT_RESERVE = 1  # "The light reserve at the light knee": 1.47-1.48x for 6-7% of the flood's rate


class SloConfig(BaseModel):
    """A TTFT and/or TPOT objective in seconds (either may be left out)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    tpot_s: float | None = Field(None, gt=0, allow_inf_nan=False)

    def slo(self) -> LatencySlo:
        return LatencySlo(self.ttft_s, self.tpot_s)
