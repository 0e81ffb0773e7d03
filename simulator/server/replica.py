"""One simulated vLLM replica wired together: engine, real-time driver, metrics, faults, models, ASGI app."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simulator import tokenizer
from simulator.engine import Engine, EngineConfig, EngineStats
from simulator.profiles import get_profile
from simulator.server.adapters import ModelRegistry
from simulator.server.app import ReplicaApp
from simulator.server.driver import EngineDriver
from simulator.server.faults import FaultConfig, FaultState
from simulator.server.generation import GenerationHandler
from simulator.server.metrics import ReplicaMetrics
from simulator.server.sse import PieceCache

if TYPE_CHECKING:
    from simulator.kv_events.publisher import KVEventPublisher


@dataclass(frozen=True)
class ReplicaConfig:
    """How one replica is built. Sizes in tokens and blocks; `time_scale` in wall s per simulated s.

    `kv_blocks` None = what the profile's GPU memory holds; `model` None = the profile's model name;
    `max_model_len` None = the profile's; `adapters` are loaded at start (path `/models/<name>`) and
    need `max_loras` >= 1. `fault_seed` seeds the error-rate draws. `api_key`: as `vllm serve
    --api-key`, every `/v1/*` request must carry `Authorization: Bearer <api_key>` (else 401).
    """

    profile: str = "tiny"
    time_scale: float = 1.0
    block_size: int = 16
    kv_blocks: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    max_loras: int = 0
    adapters: tuple[str, ...] = ()
    model: str | None = None
    scheduling_policy: str = "fcfs"
    faults: FaultConfig = field(default_factory=FaultConfig)
    fault_seed: int = 0
    api_key: str | None = None

    def __post_init__(self) -> None:
        if self.adapters and self.max_loras < 1:
            raise ValueError("adapters need max_loras >= 1")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")


class Replica:
    """One replica's parts. Build inside a running event loop, `start()` it, serve `app`, `await stop()`.

    With `kv_events` (a bound publisher, which the replica then owns and closes), the engine records
    vLLM's KV-cache events and the driver publishes them, one batch per step.
    All parts live on that loop; from another thread, hop onto it (`loop.call_soon_threadsafe`).
    """

    def __init__(self, config: ReplicaConfig, kv_events: KVEventPublisher | None = None) -> None:
        self.config = config
        self.kv_events = kv_events
        profile = get_profile(config.profile)
        self.model_name = config.model or profile.model_name
        engine_config = EngineConfig(
            block_size=config.block_size, num_gpu_blocks=config.kv_blocks, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens, max_model_len=config.max_model_len,
            enable_prefix_caching=config.enable_prefix_caching, max_loras=config.max_loras,
            scheduling_policy=config.scheduling_policy, kv_events=kv_events is not None,
        )
        self.engine = engine = Engine(profile, engine_config)
        self.max_model_len = engine.max_model_len
        self.faults = FaultState(config.faults, seed=config.fault_seed)
        num_blocks = engine.num_gpu_blocks
        self.metrics = ReplicaMetrics(
            self.model_name, lambda: engine.stats,
            cache_config=_cache_config_labels(config, num_blocks, profile.hbm_utilization),
            max_loras=config.max_loras, time_scale=config.time_scale,
            slowdown=lambda: self.faults.config.slowdown,
        )
        self.driver = EngineDriver(engine, self.metrics, time_scale=config.time_scale,
                                   slowdown=lambda: self.faults.config.slowdown,
                                   lora_enabled=config.max_loras > 0, kv_events=kv_events)
        self.models = ModelRegistry(self.model_name, self.max_model_len, lora_enabled=config.max_loras > 0,
                                    adapters={name: f"/models/{name}" for name in config.adapters})
        generation = GenerationHandler(engine, self.driver, self.models, self.faults,
                                       PieceCache(tokenizer.decode_token),
                                       priority_scheduling=config.scheduling_policy == "priority")
        self.app = ReplicaApp(engine, self.driver, self.models, self.faults, self.metrics, generation,
                              api_key=config.api_key)

    @property
    def stats(self) -> EngineStats:
        """A snapshot of the engine's live stats."""
        return self.engine.stats

    def set_faults(self, **changes: Any) -> FaultConfig:
        """Change some faults (fields of `FaultConfig`); returns the new faults. ValueError on a bad one."""
        self.faults.config = self.faults.config.merged(changes)
        return self.faults.config

    def clear_faults(self) -> None:
        self.faults.config = FaultConfig()

    def start(self) -> None:
        if self.kv_events is not None:
            self.kv_events.start()
        self.driver.start()

    async def stop(self) -> None:
        await self.driver.stop()
        if self.kv_events is not None:
            await self.kv_events.close()


def _cache_config_labels(config: ReplicaConfig, num_blocks: int, utilization: float) -> dict[str, str]:
    """vLLM's `cache_config_info` labels (a subset of its ~40, the ones a router reads and their kin)."""
    return {
        "block_size": str(config.block_size),
        "cache_dtype": "auto",
        "enable_prefix_caching": str(config.enable_prefix_caching),
        "gpu_memory_utilization": str(utilization),
        "is_attention_free": "False",
        "kv_cache_size_tokens": str(num_blocks * config.block_size),
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(num_blocks),
        "num_gpu_blocks_override": str(config.kv_blocks),
        "prefix_caching_hash_algo": "sha256",
        "sliding_window": "None",
        "user_specified_block_size": "True",
    }
