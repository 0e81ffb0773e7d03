"""The engine records vLLM's KV-cache events from its real block manager, and they add up to its cache.

No sockets here: the engine's `take_kv_events` after each step is what the driver publishes as one batch.
"""

from __future__ import annotations

import random

import pytest

from simulator.engine import Engine, EngineConfig, EngineRequest
from simulator.kv_cache import adapter_extra_key, chain_key, compute_block_keys
from simulator.kv_events.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, external_hash
from simulator.profiles import get_profile
from tests.simulator.engine_run import distinct_prompt, request, run

TINY = get_profile("tiny")
BS = 4
_ROOT = 0x6B7667617465  # kv_cache's parent key of a first block


def engine(num_blocks: int = 64, **kw: object) -> Engine:
    return Engine(TINY, EngineConfig(block_size=BS, num_gpu_blocks=num_blocks, kv_events=True, **kw))  # type: ignore[arg-type]


def run_batches(e: Engine, arrivals: list[tuple[float, EngineRequest]], now: float = 0.0
                ) -> list[list[KVEvent]]:
    """Each step's events (the batches the driver would publish; empty steps publish nothing)."""
    batches: list[list[KVEvent]] = []
    run(e, now, arrivals=arrivals, after_step=lambda eng, _: batches.append(eng.take_kv_events()))
    return [b for b in batches if b]


def signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def findable(e: Engine) -> set[int]:
    cache = e.kv_cache
    return {external_hash(k) for b in range(cache.num_blocks) if (k := cache.block_key(b)) is not None}


def test_events_are_off_unless_asked() -> None:
    e = Engine(TINY, EngineConfig(block_size=BS, num_gpu_blocks=64))
    run(e, arrivals=[(0.0, request("a", distinct_prompt(1, 20)))])
    assert e.kv_cache.num_cached_blocks > 0
    assert e.take_kv_events() == []


def test_a_prompt_is_stored_as_one_chain_with_its_tokens_then_output_blocks_chain_on() -> None:
    e = engine()
    prompt = distinct_prompt(1, 13)  # 3 full blocks and one token
    batches = run_batches(e, [(0.0, request("a", prompt, max_tokens=6))])
    first = batches[0]
    assert len(first) == 1 and isinstance(first[0], BlockStored)
    stored = first[0]
    keys = compute_block_keys(prompt, BS)
    assert stored.block_hashes == tuple(external_hash(k) for k in keys)
    assert all(0 <= h < 1 << 64 for h in stored.block_hashes)
    assert stored.parent_block_hash is None
    assert stored.token_ids == tuple(prompt[:12])
    assert stored.block_size == BS
    assert stored.lora_name is None and stored.lora_id is None
    assert stored.extra_keys == (None, None, None)
    assert (stored.medium, stored.group_idx, stored.kv_cache_spec_kind) == ("GPU", 0, "full_attention")
    # The 4th block fills with the prompt's last token and 3 generated ones, in a later step.
    later = [ev for batch in batches[1:] for ev in batch]
    assert len(later) == 1 and isinstance(later[0], BlockStored)
    assert later[0].parent_block_hash == stored.block_hashes[-1]
    assert later[0].token_ids[0] == prompt[12]
    assert findable(e) == {*stored.block_hashes, *later[0].block_hashes}


def test_hashes_recompute_from_parent_and_tokens() -> None:
    """What the exact index relies on: each hash is the chain key of its parent and its tokens."""
    e = engine()
    batches = run_batches(e, [(0.0, request("a", distinct_prompt(2, 30), max_tokens=9)),
                              (0.0, request("b", distinct_prompt(3, 22), max_tokens=3, adapter=None))])
    for ev in (ev for batch in batches for ev in batch):
        assert isinstance(ev, BlockStored)
        parent = _ROOT if ev.parent_block_hash is None else signed(ev.parent_block_hash)
        for i, h in enumerate(ev.block_hashes):
            parent = chain_key(parent, ev.token_ids[i * BS : (i + 1) * BS], 0)
            assert external_hash(parent) == h


def test_a_cache_hit_stores_only_the_new_blocks() -> None:
    e = engine()
    shared = distinct_prompt(4, 16)
    run_batches(e, [(0.0, request("a", [*shared, 1], max_tokens=1))])
    batches = run_batches(e, [(1.0, request("b", [*shared, 7, 8, 9, 10, 11], max_tokens=1))], now=1.0)
    (stored,) = [ev for batch in batches for ev in batch]
    assert isinstance(stored, BlockStored)
    assert stored.parent_block_hash == external_hash(compute_block_keys(shared, BS)[-1])
    assert stored.token_ids == (7, 8, 9, 10)


def test_evicting_a_cached_block_removes_it_one_event_per_block_before_the_stores() -> None:
    e = engine(num_blocks=8)
    run_batches(e, [(0.0, request("a", distinct_prompt(5, 16), max_tokens=1))])
    first = findable(e)
    batches = run_batches(e, [(1.0, request("b", distinct_prompt(6, 20), max_tokens=1))], now=1.0)
    events = batches[0]
    removed = [ev for ev in events if isinstance(ev, BlockRemoved)]
    assert removed and all(len(ev.block_hashes) == 1 for ev in removed)
    assert {ev.block_hashes[0] for ev in removed} <= first
    assert isinstance(events[-1], BlockStored) and events[:len(removed)] == removed


def test_reset_records_all_blocks_cleared_for_the_next_batch_and_a_refused_reset_nothing() -> None:
    e = engine()
    e.add_request(request("a", distinct_prompt(7, 12), max_tokens=3), 0.0)
    e.step(0.0)
    e.take_kv_events()
    assert e.reset_prefix_cache() is False  # blocks in use: vLLM refuses, and publishes nothing
    assert e.take_kv_events() == []
    run(e, 0.0)
    e.take_kv_events()
    assert e.reset_prefix_cache() is True
    batches = run_batches(e, [(1.0, request("b", distinct_prompt(8, 8), max_tokens=1))], now=1.0)
    assert isinstance(batches[0][0], AllBlocksCleared)
    assert isinstance(batches[0][1], BlockStored) and batches[0][1].parent_block_hash is None


def test_adapter_blocks_carry_its_name_id_and_extra_keys() -> None:
    e = engine(max_loras=1)
    prompt = distinct_prompt(9, 8)
    lora = EngineRequest("a", prompt, 1, adapter="sql-lora", adapter_id=3)
    (batch,) = run_batches(e, [(0.0, lora)])
    (stored,) = batch
    assert isinstance(stored, BlockStored)
    assert (stored.lora_name, stored.lora_id) == ("sql-lora", 3)
    assert stored.extra_keys == (("sql-lora",), ("sql-lora",))
    extra = adapter_extra_key("sql-lora")
    assert stored.block_hashes[0] == external_hash(chain_key(_ROOT, prompt[:4], extra))


def test_a_block_whose_key_another_block_holds_is_not_published_and_splits_the_chain() -> None:
    """The simulator keeps one findable block per key (vLLM would also publish the duplicate)."""
    e = engine()
    prompt = distinct_prompt(10, 13)
    keys = compute_block_keys(prompt, BS)
    cache = e.kv_cache
    (holder,) = cache.allocate(1)
    assert cache.cache_full_block(holder, keys[1])
    cache.free([holder])
    e.take_kv_events()
    (batch,) = run_batches(e, [(0.0, request("a", prompt, max_tokens=1))])
    assert batch == [
        BlockStored((external_hash(keys[0]),), None, tuple(prompt[0:4]), BS, extra_keys=(None,)),
        BlockStored((external_hash(keys[2]),), external_hash(keys[1]), tuple(prompt[8:12]), BS,
                    extra_keys=(None,)),
    ]


@pytest.mark.parametrize("seed", range(6))
def test_the_published_picture_is_the_cache_after_every_step(seed: int) -> None:
    """Replaying every batch into a set of hashes gives exactly the findable keys, whatever the load:
    shared prefixes, adapters, a cache too small (evictions, preemptions), aborts and resets."""
    rng = random.Random(seed)
    e = engine(num_blocks=24, max_num_batched_tokens=24, max_num_seqs=6, max_loras=2)
    picture: set[int] = set()
    stems = [distinct_prompt(100 + i, 12) for i in range(3)]
    now, n, removed = 0.0, 0, 0
    for _ in range(300):
        if rng.random() < 0.4:
            stem = rng.choice(stems)[: rng.choice((4, 8, 12))]
            prompt = [*stem, *(rng.randrange(10**6) for _ in range(rng.randrange(1, 20)))]
            adapter = rng.choice((None, None, "a", "b"))
            e.add_request(EngineRequest(f"r{n}", prompt, rng.randrange(1, 12), adapter=adapter, seed=n), now)
            n += 1
        if rng.random() < 0.05 and n:
            e.finish_request(f"r{rng.randrange(n)}", now)
        if rng.random() < 0.05:
            e.reset_prefix_cache()
        result = e.step(now)
        now = result.end + 0.001
        for ev in e.take_kv_events():
            if isinstance(ev, BlockStored):
                assert not picture & set(ev.block_hashes)
                picture |= set(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                assert ev.block_hashes[0] in picture
                picture -= set(ev.block_hashes)
                removed += 1
            else:
                picture.clear()
        assert picture == findable(e)
    # The load did what it is meant to: evictions, preemptions and prefix hits all happened.
    assert removed and e.stats.num_preemptions and e.stats.prefix_cache_hits_tokens
