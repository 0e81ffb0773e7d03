"""The `flow_control` section of kvgate's config: priority bands, the saturation thresholds (hard
caps), the fair-share reserve and the latency gate's knees (their meaning: gateway/config_slo.py).
Split from gateway/config.py, which re-exports these models as parts of `Config`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.config_slo import (
    DEFAULT_KNEE_FACTOR,
    DEFAULT_LIGHT_KNEE_FACTOR,
    DEFAULT_LIGHT_RESERVE,
    DEFAULT_SOLO_KNEE_FACTOR,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BandConfig(_Strict):
    max_wait_s: float = Field(ge=0)
    ttft_slo_s: float | None = Field(None, gt=0, allow_inf_nan=False)  # gateway/config_slo.py
    tpot_slo_s: float | None = Field(None, gt=0, allow_inf_nan=False)


BandName = Literal["critical", "standard", "sheddable"]


def _default_bands() -> dict[BandName, BandConfig]:
    b = BandConfig
    return {"critical": b(max_wait_s=30.0), "standard": b(max_wait_s=10.0), "sheddable": b(max_wait_s=0.0)}


class SaturationConfig(_Strict):
    max_waiting_per_replica: int = Field(4, ge=0)
    max_kv_usage: float = Field(0.9, gt=0, le=1)
    max_in_flight_per_replica: int = Field(128, ge=1)


class FairShareConfig(_Strict):
    """The slots kept for tenants below their fair share (policies/fair_share)."""

    reserve_per_replica: int = Field(2, ge=0)  # per healthy replica of the pool; 0 = off
    active_window_s: float = Field(10.0, ge=0, allow_inf_nan=False)  # a tenant stays active this long


class FlowControlConfig(_Strict):
    enabled: bool = True
    saturation: SaturationConfig = SaturationConfig()
    fair_share: FairShareConfig = FairShareConfig()
    bands: dict[BandName, BandConfig] = Field(default_factory=_default_bands)
    max_queue: int = Field(2048, ge=0)
    max_queue_per_tenant: int = Field(512, ge=0)
    pass_priority: bool = False  # send the band as vLLM's integer `priority`
    retry_after_fallback_s: int = Field(5, ge=1)
    predicted_admission: bool = True  # the latency gate (gateway/config_slo.py)
    knee_factor: float = Field(DEFAULT_KNEE_FACTOR, gt=1, le=100, allow_inf_nan=False)
    solo_knee_factor: float = Field(DEFAULT_SOLO_KNEE_FACTOR, gt=1, le=100, allow_inf_nan=False)
    light_knee_factor: float = Field(DEFAULT_LIGHT_KNEE_FACTOR, gt=1, le=100, allow_inf_nan=False)
    light_reserve: int = Field(DEFAULT_LIGHT_RESERVE, ge=0, le=1024)  # room at the light knee kept for them
