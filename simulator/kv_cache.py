"""A paged KV cache with automatic prefix caching, as vLLM's V1 engine keeps it.

The cache owns `num_blocks` blocks of `block_size` tokens, numbered 0 .. num_blocks-1. A block in use
has a reference count (one per request holding it). A block whose count drops to 0 joins the free
queue but keeps its contents: while it sits there its key still finds it, and a request that hits it
takes it back out. Allocation pops the oldest free block (the front of the queue) and forgets its key,
so cached blocks are evicted least recently freed first; a request's blocks are freed tail first, so a
sequence's tail goes before its head.

A block's key is `chain_key(parent key, block token ids, extra)`: equal keys mean equal prefixes (up to
a 64-bit hash collision). Only full blocks get keys. `extra` separates caches that must not share
(the LoRA adapter). Keys are Python's tuple hash of ints, which is the same in every process.

With an event log (`events`, when KV-cache events are enabled) the cache records what vLLM's block
pool publishes: a `removed` event when a cached block is taken for new tokens and its key forgotten,
`cleared` on a successful `reset_prefix_cache`. (The scheduler records `stored`: it knows the tokens.)

Every operation costs O(blocks it touches); nothing scans all blocks except `reset_prefix_cache`.
Not thread-safe: one engine owns one cache.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import xxhash

from simulator.kv_events.log import KVEventLog

_ROOT_KEY = 0x6B7667617465  # parent key of a sequence's first block ("kvgate")


def adapter_extra_key(adapter: str | None) -> int:
    """The `extra` of block keys for requests of `adapter` (0 for the base model)."""
    if adapter is None:
        return 0
    return int(xxhash.xxh3_64_intdigest(adapter.encode("utf-8")))


def chain_key(parent: int, block_tokens: Sequence[int], extra: int) -> int:
    """The key of one full block: hashes its parent's key, its token ids and `extra` together."""
    return hash((parent, extra, *block_tokens))


def compute_block_keys(
    token_ids: Sequence[int], block_size: int, extra_key: str | None = None, *, start_keys: Sequence[int] = ()
) -> list[int]:
    """Keys of every full block of `token_ids` (a trailing partial block gets none).

    `extra_key` is the LoRA adapter name (None for the base model). `start_keys` are keys already
    known for the first blocks (they are returned as given and the rest chain on from the last one).
    """
    extra = adapter_extra_key(extra_key)
    keys = list(start_keys)
    extend_block_keys(keys, token_ids, block_size, extra)
    return keys


def extend_block_keys(keys: list[int], token_ids: Sequence[int], block_size: int, extra: int) -> None:
    """Append to `keys` the keys of the full blocks of `token_ids` it does not hold yet."""
    parent = keys[-1] if keys else _ROOT_KEY
    for start in range(len(keys) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, extra, *token_ids[start : start + block_size]))
        keys.append(parent)


class FreeBlockQueue:
    """Free block ids in eviction order (front = evicted next), with O(1) removal from the middle.

    A doubly linked list over two int arrays (4 bytes a block), so 50k-block caches stay small.
    Starts holding every block in id order.
    """

    __slots__ = ("_head", "_len", "_next", "_prev")

    def __init__(self, num_blocks: int) -> None:
        # Node `num_blocks` is the sentinel: its next is the front, its prev the back.
        head = self._head = num_blocks
        self._next = array("i", range(1, num_blocks + 2))
        self._prev = array("i", range(-1, num_blocks))
        self._next[head] = 0 if num_blocks else head
        self._prev[head] = num_blocks - 1 if num_blocks else head
        if num_blocks:
            self._next[num_blocks - 1] = head
            self._prev[0] = head
        self._len = num_blocks

    def __len__(self) -> int:
        return self._len

    def popleft(self) -> int:
        """Remove and return the front block id (IndexError when empty)."""
        if not self._len:
            raise IndexError("no free blocks")
        block = self._next[self._head]
        self._unlink(block)
        return block

    def append(self, block: int) -> None:
        """Put `block` (which must not be queued) at the back."""
        head = self._head
        last = self._prev[head]
        self._next[last] = block
        self._prev[block] = last
        self._next[block] = head
        self._prev[head] = block
        self._len += 1

    def remove(self, block: int) -> None:
        """Take `block` (which must be queued) out of the queue."""
        self._unlink(block)

    def _unlink(self, block: int) -> None:
        nxt, prv = self._next[block], self._prev[block]
        self._next[prv] = nxt
        self._prev[nxt] = prv
        self._len -= 1

    def __iter__(self) -> FreeBlockIterator:
        return FreeBlockIterator(self._next, self._head)


class FreeBlockIterator:
    """Front-to-back walk of a `FreeBlockQueue` (for tests and `reset_prefix_cache`)."""

    __slots__ = ("_at", "_head", "_next")

    def __init__(self, next_links: array[int], head: int) -> None:
        self._next = next_links
        self._head = head
        self._at = next_links[head]

    def __iter__(self) -> FreeBlockIterator:
        return self

    def __next__(self) -> int:
        if self._at == self._head:
            raise StopIteration
        block = self._at
        self._at = self._next[block]
        return block


class KVCache:
    """Block pool + prefix cache of one engine (see the module docstring).

    Block ids handed out are owned by the caller until given back with `free`; the cache never moves
    a block that has a reference.
    """

    __slots__ = (
        "_cached", "_free", "_key_of", "_ref", "block_size", "enable_prefix_caching", "events", "num_blocks",
    )  # fmt: skip

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
        events: KVEventLog | None = None,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = array("i", bytes(4 * num_blocks))
        self._key_of: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # key -> block id holding it
        self._free = FreeBlockQueue(num_blocks)
        self.events = events

    @property
    def num_free_blocks(self) -> int:
        """Blocks with no reference (empty or cached-but-unused): what allocation can still take."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (0..1); cached-but-unused blocks count as free, as vLLM reports."""
        return (self.num_blocks - len(self._free)) / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that currently hold a findable key (in use or free)."""
        return len(self._cached)

    def find_cached_prefix(self, keys: Sequence[int], max_blocks: int | None = None) -> list[int]:
        """Block ids holding the longest cached prefix of `keys` (at most `max_blocks`), stopping at
        the first miss. Takes no reference: follow with `touch` to keep them."""
        if not self.enable_prefix_caching:
            return []
        cached = self._cached
        hits: list[int] = []
        for key in keys if max_blocks is None else keys[:max_blocks]:
            block = cached.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_free_among(self, block_ids: Sequence[int]) -> int:
        """How many of `block_ids` have no reference (touching them takes them off the free queue)."""
        ref = self._ref
        return sum(1 for b in block_ids if not ref[b])

    def touch(self, block_ids: Sequence[int]) -> None:
        """Take a reference to each of `block_ids` (cache hits), pulling free ones off the free queue."""
        ref = self._ref
        for b in block_ids:
            if not ref[b]:
                self._free.remove(b)
            ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """`n` fresh blocks with one reference each, oldest free first; their old keys are forgotten.

        Raises ValueError if fewer than `n` blocks are free (check `num_free_blocks` first).
        """
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} blocks, {len(self._free)} free")
        free, ref, key_of, cached, events = self._free, self._ref, self._key_of, self._cached, self.events
        blocks = []
        for _ in range(n):
            b = free.popleft()
            key = key_of[b]
            if key is not None:
                key_of[b] = None
                if cached.get(key) == b:
                    del cached[key]
                    if events is not None:
                        events.removed(key)
            ref[b] = 1
            blocks.append(b)
        return blocks

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each of `block_ids` (one request's blocks, in sequence order).

        Blocks left without references join the free queue tail first, so that the end of a sequence
        is evicted before its beginning.
        """
        ref, free = self._ref, self._free
        for b in reversed(block_ids):
            ref[b] -= 1
            if not ref[b]:
                free.append(b)

    def cache_full_block(self, block_id: int, key: int) -> bool:
        """Make full block `block_id` findable under `key`; True if it now is. A key another block
        already holds stays with that block (this one then stays unkeyed and False is returned; vLLM
        keeps such duplicates findable too, see `simulator/kv_events/log.py`)."""
        if not self.enable_prefix_caching or self._key_of[block_id] is not None:
            return False
        if key in self._cached:
            return False
        self._cached[key] = block_id
        self._key_of[block_id] = key
        return True

    def block_key(self, block_id: int) -> int | None:
        """The key `block_id` is findable under, or None."""
        return self._key_of[block_id]

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def free_queue_order(self) -> list[int]:
        """Free block ids, next to be evicted first (O(num_blocks); for tests and debugging)."""
        return list(self._free)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached key, as vLLM's `POST /reset_prefix_cache` does.

        Like vLLM, refuses (returns False, changes nothing) while any block is in use; True otherwise.
        """
        if len(self._free) != self.num_blocks:
            return False
        self._cached.clear()
        self._key_of = [None] * self.num_blocks
        if self.events is not None:
            self.events.cleared()
        return True
