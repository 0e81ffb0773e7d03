"""What goes into the engine, what comes out of it, and the engine's own record of a request.

Times are seconds on the engine's clock (the `now` values its driver passes in; simulated seconds).
Token counts are tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(slots=True)
class EngineRequest:
    """One generation request as the engine takes it.

    `prompt_token_ids` must not be empty; the engine copies it. The request produces exactly
    `max_tokens` tokens unless finished early from outside. `adapter` is a LoRA adapter name (None for
    the base model) and `adapter_id` its integer id (vLLM's `lora_int_id`, only published in KV events
    as `lora_id`); `priority` matters under the "priority" policy (lower is served first); `seed` picks
    the filler text.
    """

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    adapter: str | None = None
    priority: int = 0
    seed: int = 0
    adapter_id: int | None = None


class TokenEvent(NamedTuple):
    """One generated token, effective at its step's `StepResult.end`.

    `index` is 0 for a request's first output token. `finished_reason` is "length" on the token that
    reaches `max_tokens` (the request has then left the engine), else None.

    Immutable like a frozen dataclass, but a NamedTuple: the engine makes one per token of every
    sequence of every step, and a NamedTuple is created 3-4x faster.
    """

    request_id: str
    token_id: int
    index: int  # type: ignore[assignment]  # shadows tuple.index, on purpose: the field is the API
    finished_reason: str | None


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A request's life in the engine, emitted once when it leaves (for metrics and usage).

    `reason` is "length", "stop", "abort" or "error". `first_scheduled` / `first_token` are None when
    it never got that far. `cached_tokens` are the prompt tokens served from the prefix cache at the
    request's first admission (what vLLM reports as `cached_tokens`); `computed_prompt_tokens` are the
    prompt tokens the engine ran through the model, recomputation after preemption included.
    """

    request_id: str
    reason: str
    adapter: str | None
    arrival: float
    first_scheduled: float | None
    first_token: float | None
    finished: float
    prompt_tokens: int
    cached_tokens: int
    computed_prompt_tokens: int
    generation_tokens: int
    max_tokens: int
    num_preemptions: int


class RequestState:
    """The engine's mutable record of one unfinished request. Owned by one `Engine`; not for drivers.

    `token_ids` is the prompt followed by the output so far; `num_computed` counts the leading tokens
    whose KV is in `blocks`. `keys` are the block keys of `token_ids`'s full blocks, extended lazily;
    the first `num_cached_blocks` of `blocks` are registered in the prefix cache. `scheduled` is the
    number of tokens the current step computes for it.
    """

    __slots__ = (
        "adapter", "adapter_id", "arrival", "blocks", "cached_tokens", "computed_prompt_tokens", "extra",
        "first_scheduled", "first_token", "keys", "max_tokens", "num_cached_blocks", "num_computed",
        "num_output", "num_preemptions", "order", "priority", "prompt_len", "request_id", "running",
        "scheduled", "seed", "token_ids",
    )  # fmt: skip

    def __init__(self, request: EngineRequest, arrival: float, order: int, extra: int) -> None:
        self.request_id = request.request_id
        self.adapter = request.adapter
        self.adapter_id = request.adapter_id
        self.priority = request.priority
        self.seed = request.seed
        self.max_tokens = request.max_tokens
        self.token_ids = list(request.prompt_token_ids)
        self.prompt_len = len(self.token_ids)
        self.arrival = arrival
        self.order = order  # admission tie-breaker: arrival order within the engine
        self.extra = extra  # block-key extra for the adapter
        self.num_computed = 0
        self.num_output = 0
        self.blocks: list[int] = []
        self.keys: list[int] = []
        self.num_cached_blocks = 0
        self.scheduled = 0
        self.running = False
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.cached_tokens = -1  # set at first admission
        self.computed_prompt_tokens = 0
        self.num_preemptions = 0

    def finished(self, reason: str, now: float) -> FinishedRequest:
        return FinishedRequest(
            request_id=self.request_id,
            reason=reason,
            adapter=self.adapter,
            arrival=self.arrival,
            first_scheduled=self.first_scheduled,
            first_token=self.first_token,
            finished=now,
            prompt_tokens=self.prompt_len,
            cached_tokens=max(self.cached_tokens, 0),
            computed_prompt_tokens=self.computed_prompt_tokens,
            generation_tokens=self.num_output,
            max_tokens=self.max_tokens,
            num_preemptions=self.num_preemptions,
        )
