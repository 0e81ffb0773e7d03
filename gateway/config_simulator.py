"""The `simulator:` section: the simulated fleet `kvgate up` runs when a config names no replicas."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SimulatorConfig(BaseModel):
    """The embedded fleet `kvgate up` starts when the config names no replicas."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int = Field(4, ge=1, le=64)
    profile: str = "llama-3-8b-h100"
    time_scale: float = Field(1.0, gt=0)
    model: str | None = None
    block_size: int = Field(16, ge=1)
    kv_blocks: int | None = Field(None, ge=1)
    max_num_seqs: int = Field(256, ge=1)
    max_loras: int = Field(0, ge=0)
    adapters: tuple[str, ...] = ()
    # The simulated replicas publish vLLM's KV-cache events and kvgate routes on the exact index built
    # from them (with the simulator's tokenizer for the pool, unless the config names another).
    kv_events: bool = True
