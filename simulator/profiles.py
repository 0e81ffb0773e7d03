"""Model/GPU profiles and the roofline that times an engine step.

A `Profile` is one replica: a model served on `tp` identical GPUs. Everything the simulator reports
about speed and capacity comes from here, with the constants and formulas of
`shared/docs/napkin.md`:

- KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element (whole model,
  summed over the TP ranks; each rank holds 1/tp of it).
- KV capacity per replica = (HBM x utilization - weights/tp - activation reserve) / (KV per token / tp).
- step time = max(compute, memory) + fixed overhead, with
  compute = (2 x params x tokens + attention FLOPs) / (tp x peak FLOP/s x efficiency) and
  memory = (weights/tp + KV tokens read x KV per token/tp) / (bandwidth x efficiency).

Units: bytes, seconds, FLOPs and FLOP/s; "GB" in the tables is 1e9 bytes. Profiles are frozen values,
safe to share between engines and threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU's peak figures: HBM in bytes, bandwidth in bytes/s, dense BF16 FLOP/s (not sparse)."""

    name: str
    hbm_bytes: float
    bandwidth_bytes_s: float
    flops: float


H100_SXM = GpuSpec("H100 SXM", hbm_bytes=80e9, bandwidth_bytes_s=3.35e12, flops=989e12)
H200 = GpuSpec("H200", hbm_bytes=141e9, bandwidth_bytes_s=4.8e12, flops=989e12)
A100_80GB = GpuSpec("A100 80GB SXM", hbm_bytes=80e9, bandwidth_bytes_s=2.04e12, flops=312e12)
L40S = GpuSpec("L40S", hbm_bytes=48e9, bandwidth_bytes_s=0.864e12, flops=362e12)
# Made up for the `tiny` profile: sized so that a ~1B model decodes in ~2 ms, prefills 2,048 tokens in
# ~16 ms and has room for ~16k tokens of KV. No such GPU exists.
TOY_GPU = GpuSpec("toy", hbm_bytes=2.632e9, bandwidth_bytes_s=1.85e12, flops=420e12)

GPUS: Mapping[str, GpuSpec] = MappingProxyType(
    {"h100": H100_SXM, "h200": H200, "a100-80gb": A100_80GB, "l40s": L40S, "toy": TOY_GPU}
)


@dataclass(frozen=True, slots=True)
class Roofline:
    """`Profile.step_time` with the constants folded into seconds per unit of work."""

    s_per_token: float
    s_per_attn_pair: float
    s_weights: float
    s_per_kv_token: float
    overhead_s: float

    def step_time(self, tokens: int, kv_tokens_read: int, attn_pairs: int) -> float:
        """Seconds for a step running `tokens` through the model (prefill + decode), reading the KV of
        `kv_tokens_read` context tokens and computing `attn_pairs` attention (query, context) pairs."""
        compute = self.s_per_token * tokens + self.s_per_attn_pair * attn_pairs
        memory = self.s_weights + self.s_per_kv_token * kv_tokens_read
        return (compute if compute > memory else memory) + self.overhead_s


@dataclass(frozen=True, slots=True)
class Profile:
    """A model served on `tp` GPUs of one kind, with the roofline efficiencies that time its steps.

    `params` is the parameter count, `weight_bytes` the whole model's weights (split evenly over `tp`
    ranks). `hidden_size` is the attention's query width (query heads x head dim) used for attention
    FLOPs; for Llama it equals the model's hidden size. `max_model_len` is the context limit in tokens
    (prompt + output). `activation_reserve_bytes` is held back per GPU for activations, and
    `hbm_utilization` is vLLM's `--gpu-memory-utilization`.
    """

    name: str
    model_name: str
    params: float
    n_layers: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    weight_bytes: float
    gpu: GpuSpec
    tp: int
    max_model_len: int
    bytes_per_elem: int = 2
    bw_efficiency: float = 0.72
    flops_efficiency: float = 0.65
    step_overhead_s: float = 0.0005
    activation_reserve_bytes: float = 2e9
    hbm_utilization: float = 0.9

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one token occupies across the whole model (all layers, all TP ranks)."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.bytes_per_elem

    def kv_capacity_tokens(self) -> int:
        """Tokens of KV the replica can hold: what is left of HBM after weights and activations."""
        free_per_gpu = (
            self.gpu.hbm_bytes * self.hbm_utilization
            - self.weight_bytes / self.tp
            - self.activation_reserve_bytes
        )
        if free_per_gpu <= 0:
            return 0
        return int(free_per_gpu / (self.kv_bytes_per_token / self.tp))

    def num_gpu_blocks(self, block_size: int) -> int:
        """KV blocks of `block_size` tokens that fit (what vLLM reports as `num_gpu_blocks`)."""
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        return self.kv_capacity_tokens() // block_size

    def step_time(
        self, prefill_tokens: int, decode_seqs: int, kv_tokens_read: int, prefill_attn_pairs: int = 0
    ) -> float:
        """Simulated seconds one engine step takes.

        `prefill_tokens` are prompt (or recomputed) tokens run through the model this step,
        `decode_seqs` the sequences decoding one token each, `kv_tokens_read` the context tokens whose
        KV the step reads (summed over scheduled sequences), `prefill_attn_pairs` the (query token,
        context token) pairs attention computes this step (each costs 4 x layers x query width FLOPs;
        decode tokens may be included, their share is small).
        """
        return self.roofline().step_time(prefill_tokens + decode_seqs, kv_tokens_read, prefill_attn_pairs)

    def roofline(self) -> Roofline:
        """The step-time formula with this profile's constants folded in (for per-step loops)."""
        flops_rate = self.tp * self.gpu.flops * self.flops_efficiency
        bytes_rate = self.gpu.bandwidth_bytes_s * self.bw_efficiency
        return Roofline(
            s_per_token=2.0 * self.params / flops_rate,
            s_per_attn_pair=4.0 * self.n_layers * self.hidden_size / flops_rate,
            s_weights=self.weight_bytes / self.tp / bytes_rate,
            s_per_kv_token=self.kv_bytes_per_token / self.tp / bytes_rate,
            overhead_s=self.step_overhead_s,
        )


def _llama_3_8b(name: str, gpu: GpuSpec) -> Profile:
    return Profile(
        name=name, model_name="llama-3-8b", params=8.03e9, n_layers=32, n_kv_heads=8, head_dim=128,
        hidden_size=4096, weight_bytes=16.1e9, gpu=gpu, tp=1, max_model_len=8192,
    )  # fmt: skip


PROFILES: Mapping[str, Profile] = MappingProxyType(
    {
        "llama-3-8b-h100": _llama_3_8b("llama-3-8b-h100", H100_SXM),
        "llama-3-8b-h200": _llama_3_8b("llama-3-8b-h200", H200),
        "llama-3-70b-h100-tp4": Profile(
            name="llama-3-70b-h100-tp4", model_name="llama-3-70b", params=70.6e9, n_layers=80,
            n_kv_heads=8, head_dim=128, hidden_size=8192, weight_bytes=141e9, gpu=H100_SXM, tp=4,
            max_model_len=8192,
        ),
        # Qwen3-32B's hidden size is 5120 but its 64 query heads x 128 make attention 8192 wide.
        "qwen3-32b-h200": Profile(
            name="qwen3-32b-h200", model_name="qwen3-32b", params=32.8e9, n_layers=64, n_kv_heads=8,
            head_dim=128, hidden_size=8192, weight_bytes=65.6e9, gpu=H200, tp=1, max_model_len=32768,
        ),
        # For tests: a TinyLlama-like 1B model on the made-up TOY_GPU. Same formulas, small numbers:
        # KV 16 KiB/token, ~16.4k tokens (1,025 blocks of 16), decode step ~2.0 ms, prefill of 2,048
        # tokens ~16.5 ms.
        "tiny": Profile(
            name="tiny", model_name="tiny-llama", params=1.0e9, n_layers=16, n_kv_heads=4, head_dim=64,
            hidden_size=2048, weight_bytes=2.0e9, gpu=TOY_GPU, tp=1, max_model_len=4096,
            activation_reserve_bytes=0.1e9,
        ),
    }
)  # fmt: skip


def get_profile(name: str) -> Profile:
    """The built-in profile called `name`; ValueError naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown profile {name!r}; known profiles: {known}") from None
