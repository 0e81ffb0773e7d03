"""`headroom:`: the SLOs goodput headroom is computed against, and the request mix it assumes first.

    headroom:
      ttft_slo_s: 1.0          # time to first token a request should meet (seconds)
      tpot_slo_s: 0.1          # time per output token after the first (seconds)
      default_prompt_tokens: 1000   # the request mix before kvgate has seen a pool's answers
      default_output_tokens: 200

Goodput headroom (`policies.latency.headroom`, exported as `kvgate_pool_goodput_headroom_*` and on
`GET /admin/pools`) is how much more load each pool could take while its requests meet these SLOs.
When the flow-control bands carry SLOs of their own (`flow_control.bands.standard.ttft_slo_s` /
`tpot_slo_s`, from admission on predicted latency), `headroom_slos` takes the standard band's: the
SLOs a request admitted by default is held to are the ones capacity should be counted against.
The defaults suit an interactive chat service on the napkin's Llama-3-8B/H100 (a step of ~7 ms, a
1,000-token prefill in ~25 ms); a simulator run slower than real time needs them scaled alike.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from policies.latency.headroom import Mix, Slos


class HeadroomConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_slo_s: float = Field(1.0, gt=0, allow_inf_nan=False)
    tpot_slo_s: float = Field(0.1, gt=0, allow_inf_nan=False)
    default_prompt_tokens: int = Field(1000, ge=0)
    default_output_tokens: int = Field(200, ge=1)

    def default_mix(self) -> Mix:
        tokens = float(self.default_prompt_tokens)
        return Mix(tokens, tokens, float(self.default_output_tokens))


def headroom_slos(config: Any) -> Slos:
    """The SLOs headroom is computed against: the standard band's when it has them (either may be
    set alone), else `headroom:`'s. Reads the band's settings only if this config has them, so it
    works before and after admission's SLO settings exist."""
    own: HeadroomConfig = config.headroom
    band = config.flow_control.bands.get("standard")
    ttft = getattr(band, "ttft_slo_s", None)
    tpot = getattr(band, "tpot_slo_s", None)
    return Slos(
        ttft_s=float(ttft) if ttft else own.ttft_slo_s,
        tpot_s=float(tpot) if tpot else own.tpot_slo_s,
    )
