"""The paged KV cache: keys, prefix lookups, reference counts and eviction order."""

from __future__ import annotations

import pytest

from simulator.kv_cache import (
    FreeBlockQueue,
    KVCache,
    adapter_extra_key,
    compute_block_keys,
    extend_block_keys,
)

BS = 4


def test_only_full_blocks_get_keys() -> None:
    assert len(compute_block_keys(list(range(11)), BS)) == 2
    assert len(compute_block_keys(list(range(12)), BS)) == 3
    assert compute_block_keys([1, 2, 3], BS) == []


def test_keys_chain_the_prefix() -> None:
    a = compute_block_keys([1, 2, 3, 4, 5, 6, 7, 8], BS)
    b = compute_block_keys([9, 2, 3, 4, 5, 6, 7, 8], BS)
    assert a[0] != b[0]
    assert a[1] != b[1], "same second block after a different first block must not match"
    assert compute_block_keys([1, 2, 3, 4, 5, 6, 7, 9], BS)[0] == a[0]


def test_adapter_separates_keys() -> None:
    tokens = list(range(8))
    base = compute_block_keys(tokens, BS)
    lora_a = compute_block_keys(tokens, BS, "lora-a")
    lora_b = compute_block_keys(tokens, BS, "lora-b")
    assert len({base[0], lora_a[0], lora_b[0]}) == 3
    assert compute_block_keys(tokens, BS, "lora-a") == lora_a
    assert adapter_extra_key(None) == 0


def test_keys_extend_incrementally() -> None:
    tokens = list(range(20))
    keys = compute_block_keys(tokens[:9], BS)
    extend_block_keys(keys, tokens, BS, 0)
    assert keys == compute_block_keys(tokens, BS)
    assert compute_block_keys(tokens, BS, start_keys=keys[:2]) == keys


def test_free_queue_order_and_removal() -> None:
    q = FreeBlockQueue(5)
    assert list(q) == [0, 1, 2, 3, 4]
    q.remove(2)
    assert q.popleft() == 0
    q.append(0)
    q.append(2)
    assert list(q) == [1, 3, 4, 0, 2]
    assert len(q) == 5
    for expected in [1, 3, 4, 0, 2]:
        assert q.popleft() == expected
    with pytest.raises(IndexError):
        q.popleft()


def test_allocate_takes_oldest_free_first() -> None:
    cache = KVCache(num_blocks=6, block_size=BS)
    assert cache.allocate(2) == [0, 1]
    assert cache.num_free_blocks == 4
    assert cache.usage == pytest.approx(2 / 6)
    with pytest.raises(ValueError):
        cache.allocate(5)


def test_free_is_tail_first() -> None:
    cache = KVCache(num_blocks=6, block_size=BS)
    blocks = cache.allocate(3)
    cache.free(blocks)
    assert cache.free_queue_order() == [3, 4, 5, 2, 1, 0]
    assert cache.usage == 0


def prefill(cache: KVCache, tokens: list[int], adapter: str | None = None) -> tuple[list[int], list[int]]:
    """What an engine does for a new sequence: reuse the cached prefix, allocate, cache full blocks."""
    keys = compute_block_keys(tokens, BS, adapter)
    hits = cache.find_cached_prefix(keys)
    cache.touch(hits)
    blocks = hits + cache.allocate(-(-len(tokens) // BS) - len(hits))
    for block, key in zip(blocks, keys, strict=False):
        cache.cache_full_block(block, key)
    return blocks, hits


def test_freed_blocks_stay_findable_until_reused() -> None:
    cache = KVCache(num_blocks=8, block_size=BS)
    tokens = list(range(10))  # two full blocks + a partial one
    blocks, hits = prefill(cache, tokens)
    assert hits == []
    assert cache.num_cached_blocks == 2, "the partial block is not cached"
    cache.free(blocks)
    assert cache.usage == 0
    again, hits = prefill(cache, tokens)
    assert hits == blocks[:2]
    assert again[:2] == blocks[:2]


def test_shared_blocks_are_reference_counted() -> None:
    cache = KVCache(num_blocks=8, block_size=BS)
    first, _ = prefill(cache, list(range(8)))
    second, hits = prefill(cache, [*range(8), 99])
    assert hits == first
    assert cache.ref_count(first[0]) == 2
    cache.free(first)
    assert cache.ref_count(first[0]) == 1
    assert cache.num_used_blocks == 3
    cache.free(second)
    assert cache.num_used_blocks == 0


def test_eviction_is_oldest_freed_first_and_forgets_keys() -> None:
    cache = KVCache(num_blocks=4, block_size=BS)
    a, _ = prefill(cache, [1] * 8)
    cache.free(a)
    b, _ = prefill(cache, [2] * 8)
    cache.free(b)
    # Never-used blocks went first; now all four hold keys. The next allocation evicts a's tail block.
    assert cache.num_cached_blocks == 4
    assert cache.free_queue_order() == [a[1], a[0], b[1], b[0]]
    c, hits = prefill(cache, [3] * 4)
    assert hits == [] and c == [a[1]]
    assert cache.find_cached_prefix(compute_block_keys([1] * 8, BS)) == [a[0]]
    d, _ = prefill(cache, [4] * 4)
    assert d == [a[0]]
    assert cache.find_cached_prefix(compute_block_keys([1] * 8, BS)) == []
    assert cache.find_cached_prefix(compute_block_keys([2] * 8, BS)) == b


def test_hit_on_a_free_block_takes_it_off_the_free_queue() -> None:
    cache = KVCache(num_blocks=4, block_size=BS)
    a, _ = prefill(cache, [1] * 8)
    cache.free(a)
    hits = cache.find_cached_prefix(compute_block_keys([1] * 8, BS))
    assert cache.num_free_among(hits) == 2
    cache.touch(hits)
    assert cache.num_free_blocks == 2
    assert a[0] not in cache.free_queue_order()


def test_lookup_stops_at_first_miss_and_respects_max_blocks() -> None:
    cache = KVCache(num_blocks=8, block_size=BS)
    prefill(cache, list(range(12)))
    keys = compute_block_keys([*range(8), 0, 0, 0, 0], BS)
    assert len(cache.find_cached_prefix(keys)) == 2
    assert len(cache.find_cached_prefix(compute_block_keys(list(range(12)), BS), max_blocks=1)) == 1


def test_duplicate_key_stays_with_the_first_block() -> None:
    cache = KVCache(num_blocks=8, block_size=BS)
    keys = compute_block_keys([5] * 4, BS)
    x, y = cache.allocate(2)
    cache.cache_full_block(x, keys[0])
    cache.cache_full_block(y, keys[0])
    assert cache.block_key(x) == keys[0]
    assert cache.block_key(y) is None
    assert cache.find_cached_prefix(keys) == [x]


def test_prefix_caching_disabled_finds_nothing() -> None:
    cache = KVCache(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    blocks, _ = prefill(cache, list(range(8)))
    cache.free(blocks)
    assert cache.find_cached_prefix(compute_block_keys(list(range(8)), BS)) == []
    assert cache.num_cached_blocks == 0


def test_reset_prefix_cache_only_when_idle() -> None:
    cache = KVCache(num_blocks=8, block_size=BS)
    blocks, _ = prefill(cache, list(range(8)))
    assert cache.reset_prefix_cache() is False
    assert cache.num_cached_blocks == 2
    cache.free(blocks)
    assert cache.reset_prefix_cache() is True
    assert cache.num_cached_blocks == 0
    assert cache.find_cached_prefix(compute_block_keys(list(range(8)), BS)) == []
    # Reusing a block whose key was dropped must not disturb anything.
    assert len(cache.allocate(8)) == 8


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 16), (4, 0)])
def test_rejects_empty_pools(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError):
        KVCache(num_blocks, block_size)
