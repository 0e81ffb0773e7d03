"""Which requests run in the next step, and with which KV blocks: vLLM V1's scheduler.

Each call to `schedule`:

1. Running requests first, in admission order: a decoding request takes 1 token of the per-step
   budget (`max_num_batched_tokens`), a request still prefilling takes the next chunk of its prompt.
   When one needs a KV block and none is free, the newest running request (under the "priority"
   policy: the lowest-priority, then newest) is preempted by recompute: it loses its blocks and goes
   back to the front of the waiting queue; its tokens so far are recomputed when it is admitted again.
   If the request that needs the block is itself the one preempted, the running pass stops.
2. If nothing was preempted, waiting requests are admitted in queue order while `max_num_seqs`, the
   budget and free blocks allow. An admitted request first reuses its longest cached prefix (full
   blocks only, never its last token: that one must be computed to sample), then computes the rest, in
   chunks if the budget is short. A request whose adapter would make more than `max_loras` distinct
   adapters in the batch is skipped, not blocking those behind it. The first request that cannot get
   its blocks stops admission.

Full blocks are registered in the prefix cache when the batch is formed, as vLLM does at allocation:
a request admitted right after another with the same prompt reuses the blocks that the same step
fills, so a burst of identical prompts computes the prefix once.

The scheduler owns the waiting queue, the running list and the blocks' assignment; the engine owns
what happens to the scheduled requests. Per call it costs O(running + blocks touched), plus the
skipped waiting requests when LoRA limits bite. Not thread-safe.
"""

from __future__ import annotations

from simulator.kv_cache import KVCache, extend_block_keys
from simulator.request import RequestState
from simulator.waiting_queue import make_waiting_queue


class Scheduler:
    """Admission, batching and preemption over one `KVCache` (see the module docstring).

    Counters (cumulative): `prefix_queries` (tokens of newly admitted requests looked up in the
    prefix cache), `prefix_hits` (of those, tokens served from it), the same two for re-admissions
    after preemption (`preempted_prefix_*`; vLLM keeps them apart so that a victim finding its own
    blocks again does not inflate the hit rate), and `preemptions` (requests). Lookups are counted
    when a request is admitted, not when a blocked head-of-queue request is retried.
    """

    def __init__(
        self, cache: KVCache, *, max_num_seqs: int, max_num_batched_tokens: int, max_loras: int, policy: str
    ) -> None:
        self.cache = cache
        self.waiting = make_waiting_queue(policy)
        self.running: list[RequestState] = []
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_loras = max_loras
        self._priority = policy == "priority"
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.preempted_prefix_queries = 0
        self.preempted_prefix_hits = 0
        self.preemptions = 0
        # adapter -> requests of it running / waiting, in order of first appearance (vLLM's
        # lora_requests_info lists these), kept up to date so reading them costs O(adapters).
        self.running_adapters: dict[str, int] = {}
        self.waiting_adapters: dict[str, int] = {}

    def add(self, state: RequestState) -> None:
        self.waiting.add(state)
        _count(self.waiting_adapters, state.adapter, 1)

    def remove(self, state: RequestState) -> None:
        """Take an unfinished request out (running or waiting) and free its blocks."""
        if state.running:
            self.running.remove(state)
            self._release(state)
        else:
            self.waiting.remove(state)
            _count(self.waiting_adapters, state.adapter, -1)

    def retire(self, states: list[RequestState]) -> None:
        """Running requests that finished this step: free their blocks, drop them from `running`."""
        for state in states:
            self._release(state)
        self.running = [s for s in self.running if s.running]

    def _release(self, state: RequestState) -> None:
        state.running = False
        _count(self.running_adapters, state.adapter, -1)
        self.cache.free(state.blocks)
        state.blocks = []

    def schedule(self, now: float) -> tuple[list[RequestState], int]:
        """This step's batch (each request's `scheduled` set, blocks allocated) and the number of
        requests preempted to make room. `now` is recorded as first-scheduled time.

        The batch is empty only when nothing can run. (Under the priority policy a pass can preempt
        the very request that needed the block and stop with nothing scheduled; vLLM then runs an empty
        step and schedules again. Here that second pass happens at once, so that an empty batch always
        means "idle" to the driver.)
        """
        total_preempted = 0
        while True:
            scheduled, num_preempted = self._schedule_pass(now)
            total_preempted += num_preempted
            if scheduled or not num_preempted:
                return scheduled, total_preempted

    def _schedule_pass(self, now: float) -> tuple[list[RequestState], int]:
        cache, bs = self.cache, self.cache.block_size
        running = self.running
        budget = self.max_num_batched_tokens
        scheduled: list[RequestState] = []
        num_preempted = 0

        i = 0
        while i < len(running) and budget > 0:
            s = running[i]
            n = len(s.token_ids) - s.num_computed
            if n > budget:
                n = budget
            need = (s.num_computed + n + bs - 1) // bs - len(s.blocks)
            if need > 0:  # most decodes still have room in their last block
                while need > cache.num_free_blocks:
                    victim = max(running, key=_preemption_rank) if self._priority else running[-1]
                    at = running.index(victim) if self._priority else len(running) - 1
                    del running[at]
                    if at < i:  # already in this batch (priority policy): give its tokens back
                        scheduled.remove(victim)
                        budget += victim.scheduled
                        i -= 1
                    self._preempt(victim)
                    num_preempted += 1
                    if victim is s:
                        break
                if not s.running:
                    break
                s.blocks += cache.allocate(need)
            s.scheduled = n
            scheduled.append(s)
            budget -= n
            i += 1

        if cache.enable_prefix_caching:
            # Registered now, once no running request can be preempted any more, so that requests
            # admitted below already find the blocks this batch fills (vLLM caches at allocation).
            for s in scheduled:
                if (s.num_computed + s.scheduled) // bs > s.num_cached_blocks:
                    self._register_full_blocks(s)
        if not num_preempted:
            self._admit(now, budget, scheduled)
        return scheduled, num_preempted

    def _register_full_blocks(self, s: RequestState) -> None:
        """Make the full blocks this step completes for `s` findable in the prefix cache (and, with
        events on, record them as vLLM's `BlockStored`)."""
        cache = self.cache
        bs = cache.block_size
        full = (s.num_computed + s.scheduled) // bs
        if len(s.keys) < full:
            extend_block_keys(s.keys, s.token_ids, bs, s.extra)
        start = s.num_cached_blocks
        if cache.events is None:
            for b in range(start, full):
                cache.cache_full_block(s.blocks[b], s.keys[b])
        else:
            self._record_stored(s, start, [cache.cache_full_block(s.blocks[b], s.keys[b])
                                           for b in range(start, full)])
        s.num_cached_blocks = full

    def _record_stored(self, s: RequestState, start: int, keyed: list[bool]) -> None:
        """One `BlockStored` for blocks `start`.. of `s` that became findable (`keyed`): vLLM's one event
        per request and step. A block left unkeyed (its key is another block's) splits the chain, so
        that every published hash is one the cache finds."""
        events, bs, keys = self.cache.events, self.cache.block_size, s.keys
        assert events is not None
        run = None  # first block of the current run of keyed blocks
        for i, ok in enumerate([*keyed, False]):
            b = start + i
            if ok and run is None:
                run = b
            elif not ok and run is not None:
                events.stored(keys[run:b], keys[run - 1] if run else None, s.token_ids[run * bs : b * bs],
                              s.adapter, s.adapter_id)
                run = None

    def _preempt(self, s: RequestState) -> None:
        self._release(s)
        _count(self.waiting_adapters, s.adapter, 1)
        s.num_computed = 0
        s.num_cached_blocks = 0
        s.scheduled = 0
        s.num_preemptions += 1
        self.preemptions += 1
        self.waiting.put_back((s,))

    def _admit(self, now: float, budget: int, scheduled: list[RequestState]) -> None:
        waiting, running, cache = self.waiting, self.running, self.cache
        bs, caching = cache.block_size, cache.enable_prefix_caching
        max_seqs, max_loras = self.max_num_seqs, self.max_loras
        loras = {s.adapter for s in scheduled if s.adapter is not None} if max_loras else set()
        skipped: list[RequestState] = []
        while waiting and budget > 0 and len(running) < max_seqs:
            s = waiting.peek()
            if s.adapter is not None and s.adapter not in loras and len(loras) >= max_loras:
                skipped.append(waiting.pop())
                continue
            num_tokens = len(s.token_ids)
            hits: list[int] = []
            if caching:
                max_hit = (num_tokens - 1) // bs
                if len(s.keys) < max_hit:
                    extend_block_keys(s.keys, s.token_ids, bs, s.extra)
                hits = cache.find_cached_prefix(s.keys, max_hit)
            computed = len(hits) * bs
            n = num_tokens - computed
            if n > budget:
                n = budget
            need = (computed + n + bs - 1) // bs - len(hits)
            if need + cache.num_free_among(hits) > cache.num_free_blocks:
                break
            waiting.pop()
            cache.touch(hits)
            s.blocks = hits + cache.allocate(need)
            s.num_computed = computed
            s.num_cached_blocks = len(hits)
            if not caching:
                pass
            elif s.num_preemptions:
                self.preempted_prefix_queries += num_tokens
                self.preempted_prefix_hits += computed
            else:
                self.prefix_queries += num_tokens
                self.prefix_hits += computed
            if s.cached_tokens < 0:
                s.cached_tokens = min(computed, s.prompt_len)
            if s.first_scheduled is None:
                s.first_scheduled = now
            s.running = True
            running.append(s)
            if s.adapter is not None:
                _count(self.waiting_adapters, s.adapter, -1)
                _count(self.running_adapters, s.adapter, 1)
            s.scheduled = n
            scheduled.append(s)
            budget -= n
            if caching:
                self._register_full_blocks(s)
            if s.adapter is not None:
                loras.add(s.adapter)
        if skipped:
            waiting.put_back(skipped)


def _count(counts: dict[str, int], adapter: str | None, delta: int) -> None:
    if adapter is None:
        return
    left = counts.get(adapter, 0) + delta
    if left:
        counts[adapter] = left
    else:
        del counts[adapter]


def _preemption_rank(s: RequestState) -> tuple[int, float, int]:
    """Under the priority policy the largest rank is preempted first: lowest priority, then newest."""
    return s.priority, s.arrival, s.order
