"""What a replica's latency is assumed to be before kvgate has seen it answer: napkin roofline numbers.

A step of the engine costs max(compute of its tokens, memory read of weights + KV) + a fixed overhead
(napkin.md; `simulator.profiles.Roofline` times the simulator's steps with the same formula). For the
latency model that becomes:

- TTFT ~ `ttft_fixed_s` + `prefill_s_per_token` x uncached prefill tokens (the request's own and those
  ahead of it), never below one decode step: prefill is compute-bound, one token costs
  2 x params / (FLOP/s x efficiency);
- TPOT ~ `decode_step_s` + `decode_s_per_kv_token` x KV tokens the batch reads per step: decode is
  memory-bound, a step reads the weights and every running sequence's KV;
- a step computes at most `step_tokens` tokens (vLLM's `--max-num-batched-tokens`, 8,192 by default;
  the simulator's too): the prefill a step under way can be doing is at most that.

The defaults are Llama-3-8B on one H100 SXM (the simulator's `llama-3-8b-h100` profile: 989 TFLOP/s at
65%, 3.35 TB/s at 72%, 16.1 GB of weights, 128 KiB of KV per token, 0.5 ms step overhead). Seconds;
calibration (`policies.latency.rls`) moves each replica's coefficients from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LatencyPrior:
    """Prior coefficients of one pool's replicas (seconds, per token where named so); all > 0."""

    prefill_s_per_token: float = 2.5e-5
    ttft_fixed_s: float = 0.0005
    decode_step_s: float = 0.0072
    decode_s_per_kv_token: float = 5.4e-8
    step_tokens: int = 8192

    def __post_init__(self) -> None:
        for name in ("prefill_s_per_token", "ttft_fixed_s", "decode_step_s", "decode_s_per_kv_token"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")
        if self.step_tokens < 1:
            raise ValueError(f"step_tokens must be >= 1, got {self.step_tokens}")

    @classmethod
    def from_roofline(
        cls,
        *,
        s_per_token: float,
        s_weights: float,
        s_per_kv_token: float,
        overhead_s: float,
        time_scale: float = 1.0,
    ) -> LatencyPrior:
        """From a roofline's seconds per unit of work (`simulator.profiles.Roofline`'s fields), times
        `time_scale` (wall seconds per modelled second, as a simulator run slower than real time)."""
        return cls(
            prefill_s_per_token=s_per_token * time_scale,
            ttft_fixed_s=overhead_s * time_scale,
            decode_step_s=(s_weights + overhead_s) * time_scale,
            decode_s_per_kv_token=s_per_kv_token * time_scale,
        )

    def scaled(self, factor: float) -> LatencyPrior:
        """Every coefficient times `factor` (a replica `factor` times slower)."""
        return LatencyPrior(
            self.prefill_s_per_token * factor,
            self.ttft_fixed_s * factor,
            self.decode_step_s * factor,
            self.decode_s_per_kv_token * factor,
            self.step_tokens,
        )
