"""`models[].latency_prior`: what a pool's replicas are assumed to cost before kvgate has timed them.

The predicted-latency model (`policies.latency`) starts each replica from its pool's prior and
calibrates it online from the TTFTs and inter-token times kvgate observes, so the prior only has to
be the right order of magnitude: it decides the first requests' placement. Give either a simulator
profile's roofline (`profile`, e.g. `llama-3-8b-h100`, times `time_scale` for a simulator run slower
than real time), or the numbers themselves, or both (the numbers override the profile's). Nothing
given: Llama-3-8B on one H100 (`policies.latency.prior`). Seconds, per token where named so.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from policies.latency.prior import LatencyPrior
from simulator.profiles import PROFILES, get_profile


class LatencyPriorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str | None = None  # a simulator profile name (`kvgate sim --profile`)
    time_scale: float = Field(1.0, gt=0, allow_inf_nan=False)  # wall seconds per profile second
    prefill_s_per_token: float | None = Field(None, gt=0, allow_inf_nan=False)
    ttft_fixed_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    decode_step_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    decode_s_per_kv_token: float | None = Field(None, gt=0, allow_inf_nan=False)
    step_tokens: int | None = Field(None, ge=1)  # the engine's --max-num-batched-tokens (8192)

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, v: str | None) -> str | None:
        if v is not None and v not in PROFILES:
            raise ValueError(f"unknown profile {v!r}; known: {', '.join(sorted(PROFILES))}")
        return v

    def prior(self) -> LatencyPrior:
        base = LatencyPrior() if self.profile is None else profile_prior(self.profile, self.time_scale)
        if self.profile is None and self.time_scale != 1.0:
            base = base.scaled(self.time_scale)
        return LatencyPrior(
            self.prefill_s_per_token or base.prefill_s_per_token,
            self.ttft_fixed_s or base.ttft_fixed_s,
            self.decode_step_s or base.decode_step_s,
            self.decode_s_per_kv_token or base.decode_s_per_kv_token,
            self.step_tokens or base.step_tokens,
        )


def profile_prior(profile: str, time_scale: float = 1.0) -> LatencyPrior:
    """The prior of a simulator profile's roofline (ValueError for an unknown name)."""
    r = get_profile(profile).roofline()
    return LatencyPrior.from_roofline(
        s_per_token=r.s_per_token,
        s_weights=r.s_weights,
        s_per_kv_token=r.s_per_kv_token,
        overhead_s=r.overhead_s,
        time_scale=time_scale,
    )
