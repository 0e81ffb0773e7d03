"""The engine model: vLLM V1's scheduler and KV cache, timed by the roofline, with no I/O.

One `Engine` is one replica's engine. A driver feeds it requests and calls `step(now)`; each step
schedules one batch the way vLLM V1 does and returns what the batch produces and how long it takes in
simulated seconds. Everything is a pure function of the calls and their `now` values, so the same
engine runs behind the real-time HTTP server (which waits `duration x time_scale` between steps) and in
a discrete-event driver (which just adds `duration` to its clock).

Each step, `Scheduler` picks the batch as vLLM V1 does (running requests first, then admissions; see
`simulator/scheduler.py`). The engine then advances every scheduled request: a request whose computed
tokens reach all its tokens samples one (its first output token ends its prefill; later ones come one
per step); at `max_tokens` tokens it finishes ("length") and frees its blocks at once. Full blocks of
prompt and output are registered in the prefix cache by the scheduler when it hands out the batch.

With `kv_events` on, the KV cache and the scheduler record vLLM's KV-cache events as they work
(`simulator/kv_events/log.py`); the driver takes each step's events with `take_kv_events` and publishes
them as one batch. Off (the default), nothing is recorded.

Step time = profile roofline (max of compute and memory time, plus overhead) over the scheduled
tokens, the KV they read and their attention pairs, plus `lora_load_s` per adapter made resident.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from simulator.kv_cache import KVCache, adapter_extra_key
from simulator.kv_events.events import KVEvent
from simulator.kv_events.log import KVEventLog
from simulator.profiles import Profile
from simulator.request import EngineRequest, FinishedRequest, RequestState, TokenEvent
from simulator.scheduler import Scheduler
from simulator.tokenizer import FillerText

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineRequest",
    "EngineStats",
    "FinishedRequest",
    "StepResult",
    "TokenEvent",
]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """vLLM's engine arguments that shape scheduling. None means "from the profile".

    `num_gpu_blocks` defaults to what the profile's HBM holds. `max_model_len` (prompt + output
    tokens) defaults to the profile's, lowered to the KV capacity when the cache is smaller than that.
    `max_loras` 0 disables LoRA; otherwise it caps distinct adapters in one batch and the adapters
    resident on the GPU. `lora_load_s` is simulated seconds to make an adapter resident.
    `scheduling_policy` is "fcfs" or "priority" (lower `priority` first, then arrival). `kv_events`
    records vLLM's KV-cache events for `Engine.take_kv_events` (take them, or they pile up).
    """

    block_size: int = 16
    num_gpu_blocks: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    max_loras: int = 0
    lora_load_s: float = 0.005
    scheduling_policy: str = "fcfs"
    kv_events: bool = False


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one step did. Tokens and finishes take effect at `end` = `start` + `duration`.

    `duration` is 0 (and nothing was scheduled) only when no request can run: then wait for new work.
    `num_prefill_tokens` counts prompt and recomputed tokens, `num_decode_seqs` the requests that
    decoded one token. `num_preempted` requests were preempted in this step; `lora_load_s` of the
    duration went to making adapters resident.
    """

    start: float
    duration: float
    end: float
    tokens: list[TokenEvent]
    finished: list[FinishedRequest]
    num_prefill_tokens: int
    num_decode_seqs: int
    num_preempted: int = 0
    lora_load_s: float = 0.0

    @property
    def num_scheduled_tokens(self) -> int:
        """Tokens this step ran through the model (vLLM's iteration tokens)."""
        return self.num_prefill_tokens + self.num_decode_seqs


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot for `/metrics`: live gauges, then cumulative counters since the engine started.

    Token counters are tokens; `busy_s` is simulated seconds spent in steps. The prefix-cache counters
    are vLLM's `prefix_cache_queries/hits` (first admissions only); lookups of requests re-admitted after
    preemption are counted apart, as vLLM does (it does not export them). `prompt_tokens` counts
    every prompt token (cached or computed) of each request once, when its first token is generated,
    as vLLM's `prompt_tokens_total` does. `running_adapters` / `waiting_adapters` are the distinct
    adapters of running / waiting requests (oldest first), `resident_adapters` the GPU's LoRA slots
    (least recently used first).
    """

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    running_adapters: tuple[str, ...]
    waiting_adapters: tuple[str, ...]
    resident_adapters: tuple[str, ...]
    prefix_cache_queries_tokens: int
    prefix_cache_hits_tokens: int
    preempted_prefix_cache_queries_tokens: int
    preempted_prefix_cache_hits_tokens: int
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    steps: int
    scheduled_tokens: int
    busy_s: float
    max_loras: int
    num_gpu_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_prefix_caching: bool
    finished: Mapping[str, int] = field(default_factory=dict)  # requests that left, by reason


class Engine:
    """One replica's engine (see the module docstring). Not thread-safe: one driver owns it.

    Read-only attributes: `profile`, `config`, and the resolved `max_model_len`, `num_gpu_blocks`,
    `block_size`.
    """

    def __init__(self, profile: Profile, config: EngineConfig = EngineConfig()) -> None:
        if config.block_size < 1 or config.max_num_seqs < 1 or config.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be positive")
        if config.max_loras < 0 or config.lora_load_s < 0:
            raise ValueError("max_loras and lora_load_s must not be negative")
        num_blocks = config.num_gpu_blocks
        if num_blocks is None:
            num_blocks = profile.num_gpu_blocks(config.block_size)
        if num_blocks < 1:
            raise ValueError(f"profile {profile.name!r} leaves no memory for KV blocks")
        capacity = num_blocks * config.block_size
        max_model_len = config.max_model_len
        if max_model_len is None:
            max_model_len = min(profile.max_model_len, capacity)
        elif max_model_len > capacity:
            raise ValueError(
                f"max_model_len={max_model_len} does not fit in the KV cache ({num_blocks} blocks of "
                f"{config.block_size} tokens = {capacity} tokens); lower max_model_len or add blocks"
            )
        self.profile = profile
        self.config = config
        self.max_model_len = max_model_len
        self.num_gpu_blocks = num_blocks
        self.block_size = config.block_size
        self._roofline = profile.roofline()
        self._events = KVEventLog(config.block_size) if config.kv_events else None
        self._cache = KVCache(num_blocks, config.block_size, config.enable_prefix_caching, self._events)
        self._scheduler = Scheduler(
            self._cache,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_loras=config.max_loras,
            policy=config.scheduling_policy,
        )
        self._filler = FillerText()
        self._requests: dict[str, RequestState] = {}
        self._lora_slots: OrderedDict[str, None] = OrderedDict()  # resident adapters, LRU first
        self._next_order = 0
        # cumulative counters (the scheduler keeps the prefix-cache and preemption ones)
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._steps = 0
        self._scheduled_tokens = 0
        self._busy_s = 0.0
        self._finished: dict[str, int] = {}

    # -- requests in and out -------------------------------------------------------------------------

    def validate(self, prompt_tokens: int, max_tokens: int) -> str | None:
        """vLLM's error message if a request of this size cannot be served, else None."""
        limit = self.max_model_len
        if prompt_tokens < 1:
            return "The decoder prompt cannot be empty"
        if max_tokens < 1:
            return f"max_tokens must be at least 1, got {max_tokens}."
        if max_tokens > limit:
            return (
                f"max_tokens={max_tokens} cannot be greater than max_model_len={limit}. "
                f"Please request fewer output tokens. (parameter=max_tokens, value={max_tokens})"
            )
        if prompt_tokens >= limit:
            return (
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{prompt_tokens} input tokens. Please reduce the length of the input messages."
            )
        if prompt_tokens + max_tokens > limit:
            return (
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                f"maximum context length is {limit} tokens and your request has {prompt_tokens} input "
                f"tokens ({max_tokens} > {limit} - {prompt_tokens})."
            )
        return None

    def add_request(self, request: EngineRequest, now: float) -> None:
        """Queue `request`, arrived at `now`. ValueError if it fails `validate`, reuses the id of an
        unfinished request, or names an adapter while LoRA is off (`max_loras` 0)."""
        error = self.validate(len(request.prompt_token_ids), request.max_tokens)
        if error is not None:
            raise ValueError(error)
        if request.request_id in self._requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        if request.adapter is not None and not self.config.max_loras:
            raise ValueError(f"LoRA is disabled (max_loras=0); cannot serve adapter {request.adapter!r}")
        state = RequestState(request, now, self._next_order, adapter_extra_key(request.adapter))
        self._next_order += 1
        self._requests[request.request_id] = state
        self._scheduler.add(state)

    def finish_request(self, request_id: str, now: float, reason: str = "abort") -> FinishedRequest | None:
        """End a request from outside (client gone: "abort"; stop string matched: "stop"), freeing its
        blocks at once. None if the id is unknown or the request already finished."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return None
        self._scheduler.remove(state)
        self._finished[reason] = self._finished.get(reason, 0) + 1
        return state.finished(reason, now)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def reset_prefix_cache(self) -> bool:
        """Forget all cached prefixes; like vLLM, only when no block is in use (else False). With KV
        events on, records `AllBlocksCleared`: like vLLM's, it goes out with the next step's batch."""
        return self._cache.reset_prefix_cache()

    def take_kv_events(self) -> list[KVEvent]:
        """The KV-cache events recorded since the last call (vLLM's `take_events`); [] when off."""
        return [] if self._events is None else self._events.take()

    # -- one step ------------------------------------------------------------------------------------

    def step(self, now: float) -> StepResult:
        """Schedule and run one batch starting at `now` (see the module docstring)."""
        scheduled, num_preempted = self._scheduler.schedule(now)
        if not scheduled:
            return StepResult(now, 0.0, now, [], [], 0, 0, num_preempted)
        lora_load = self._load_adapters(scheduled) if self.config.max_loras else 0.0
        filler_ids, num_filler = self._filler.ids, len(self._filler.ids)
        new_tuple = tuple.__new__  # TokenEvent(...) without NamedTuple's Python-level __new__
        tokens: list[TokenEvent] = []
        firsts: list[RequestState] = []
        finishing: list[RequestState] = []
        prefill_tokens = decode_seqs = kv_read = pairs = 0
        # One pass over the batch: measure its work and advance every request. Only times (first
        # token, finish) wait for the duration.
        for s in scheduled:
            n, c = s.scheduled, s.num_computed
            done = s.num_computed = c + n
            kv_read += done
            if n == 1:
                pairs += done
                if s.num_output and done == len(s.token_ids):
                    decode_seqs += 1
                else:
                    prefill_tokens += 1
            else:
                prefill_tokens += n
                pairs += n * c + n * (n + 1) // 2
            if c < s.prompt_len:
                s.computed_prompt_tokens += min(done, s.prompt_len) - c
            if done < len(s.token_ids):
                continue  # a prefill chunk that is not the last
            index = s.num_output
            token = filler_ids[(s.seed + index) % num_filler]
            s.token_ids.append(token)
            s.num_output = index + 1
            if not index:
                firsts.append(s)
            if index + 1 < s.max_tokens:
                tokens.append(new_tuple(TokenEvent, (s.request_id, token, index, None)))
            else:
                tokens.append(new_tuple(TokenEvent, (s.request_id, token, index, "length")))
                finishing.append(s)

        duration = self._roofline.step_time(prefill_tokens + decode_seqs, kv_read, pairs) + lora_load
        end = now + duration
        for s in firsts:
            s.first_token = end
            self._prompt_tokens += s.prompt_len
        finished: list[FinishedRequest] = []
        if finishing:
            self._scheduler.retire(finishing)
            for s in finishing:
                del self._requests[s.request_id]
                finished.append(s.finished("length", end))
            self._finished["length"] = self._finished.get("length", 0) + len(finishing)
        self._generation_tokens += len(tokens)
        self._steps += 1
        self._scheduled_tokens += prefill_tokens + decode_seqs
        self._busy_s += duration
        return StepResult(
            now, duration, end, tokens, finished, prefill_tokens, decode_seqs, num_preempted, lora_load
        )

    def _load_adapters(self, scheduled: list[RequestState]) -> float:
        """Make the batch's adapters resident (LRU slots); seconds spent loading."""
        slots = self._lora_slots
        missing: list[str] = []
        for adapter in dict.fromkeys(s.adapter for s in scheduled if s.adapter is not None):
            if adapter in slots:
                slots.move_to_end(adapter)
            else:
                missing.append(adapter)
        for adapter in missing:
            if len(slots) >= self.config.max_loras:
                slots.popitem(last=False)
            slots[adapter] = None
        return len(missing) * self.config.lora_load_s

    # -- observing -----------------------------------------------------------------------------------

    @property
    def stats(self) -> EngineStats:
        """A fresh snapshot; O(adapters), cheap enough to read every step."""
        config, scheduler = self.config, self._scheduler
        return EngineStats(
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            kv_cache_usage=self._cache.usage,
            running_adapters=tuple(scheduler.running_adapters),
            waiting_adapters=tuple(scheduler.waiting_adapters),
            resident_adapters=tuple(self._lora_slots),
            prefix_cache_queries_tokens=scheduler.prefix_queries,
            prefix_cache_hits_tokens=scheduler.prefix_hits,
            preempted_prefix_cache_queries_tokens=scheduler.preempted_prefix_queries,
            preempted_prefix_cache_hits_tokens=scheduler.preempted_prefix_hits,
            num_preemptions=scheduler.preemptions,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            steps=self._steps,
            scheduled_tokens=self._scheduled_tokens,
            busy_s=self._busy_s,
            max_loras=config.max_loras,
            num_gpu_blocks=self.num_gpu_blocks,
            block_size=self.block_size,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_prefix_caching=config.enable_prefix_caching,
            finished=dict(self._finished),
        )

    @property
    def kv_cache(self) -> KVCache:
        """The engine's KV cache, for inspection (tests, debugging); do not mutate it."""
        return self._cache
