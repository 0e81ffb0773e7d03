"""Which replica is believed to hold which prefix blocks: a bounded, approximate picture.

The gateway records a request's block keys (`policies.prefix`) on the replica it dispatched to, and
asks, for the next request, how many of its LEADING blocks each candidate holds. It never learns
what a replica evicted; instead each replica's keys live in an LRU whose capacity, in index blocks,
comes from the replica's real KV cache (`capacity_blocks`), so the index forgets roughly when the
replica would and its memory stays bounded whatever the traffic.

Structure: each replica gets a slot (a bit); `_owners` maps a key to the bitmask of slots holding it,
and each replica has an LRU of its keys (`_KeyLru`: plain dicts and an array, which the garbage
collector does not traverse, so a million-key index adds no GC pause).

The prefix invariant. Keys are chained (key i names the whole prefix up to block i), `record` takes a
prompt's leading keys and inserts them last block first, so within any one chain a leading key is
always at least as recent as every key after it, and LRU eviction removes a chain's tail before its
head (as vLLM frees a sequence's blocks tail first). Hence what a replica holds of any chain is a
prefix of it: if it holds key i it holds keys 0..i. `match` relies on this to bisect instead of
walking every key; it holds for every sequence of `record`, `set_capacity`, `remove_replica` and
`clear` calls as long as each `record` gets a prompt's leading keys from `policies.prefix` (barring
64-bit hash collisions).

Memory (CPython 3.11, measured by `loadtests.decision_bench` with tracemalloc): about 140 bytes per
key held by one replica (the key's int object, its `_owners` entry and its LRU entry) and about 50
more for each further replica holding it; 64 replicas x 25,000 engine blocks of 16 tokens is 225 MB
at 16-token index blocks and 54 MB at 64-token ones. `estimated_bytes()` reports the current figure
(it matches tracemalloc).

Concurrency: none. One event loop owns an index and calls it from one thread; nothing here awaits.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence


def capacity_blocks(num_gpu_blocks: int, engine_block_size: int, index_block_tokens: int) -> int:
    """Index capacity of one replica, in index blocks: its KV tokens / tokens per index block.

    `num_gpu_blocks` and `engine_block_size` (tokens) come from vLLM's `cache_config_info`; 0 means
    unknown and gives 0, which callers should treat as "use the default capacity".
    """
    if index_block_tokens <= 0:
        raise ValueError(f"index_block_tokens must be positive, got {index_block_tokens}")
    return max(0, num_gpu_blocks) * max(0, engine_block_size) // index_block_tokens


_MASK_CACHE = 64  # candidate pools whose slot masks are remembered
_ABSENT = object()  # dict.pop default: stored values are None, so None means "was there"


class _KeyLru:
    """One replica's keys in exact LRU order, built only from containers the garbage collector skips.

    An OrderedDict would do, but CPython's collector traverses every entry of one on each full
    collection: ~60 ns per entry, a 100 ms pause of the event loop for 1.6 M entries. Dicts holding
    only ints and None are not tracked at all, nor are arrays. So: `young` holds keys recorded since
    the last flip, in recency order (a refresh deletes and reinserts); `old` holds the rest, and
    `order` lists old's keys least recent first as they were at the flip. Evicting walks `order` and
    skips keys that have since moved to `young`; when it runs out, young becomes old (one C-level
    copy of its keys into an array). Every key in `old` is less recent than every key in `young`, so
    the eviction order is exactly least recent first. Keys are unsigned 64-bit integers.
    """

    __slots__ = ("cursor", "old", "order", "young")

    def __init__(self) -> None:
        self.young: dict[int, None] = {}
        self.old: dict[int, None] = {}
        self.order = array("Q")
        self.cursor = 0

    def __len__(self) -> int:
        return len(self.young) + len(self.old)

    def oldest_first(self) -> list[int]:
        """Every key, least recent first."""
        old = self.old
        return [k for k in self.order[self.cursor :] if k in old] + list(self.young)

    def pop_oldest(self) -> int:
        """Remove and return the least recent key; the LRU must not be empty."""
        old = self.old
        order = self.order
        while True:
            if self.cursor >= len(order):
                self.old = old = self.young
                self.young = {}
                self.order = order = array("Q", old)
                self.cursor = 0
            key = order[self.cursor]
            self.cursor += 1
            if old.pop(key, _ABSENT) is None:
                return key


class PrefixIndex:
    """Per-replica LRUs of block keys, and a leading-block match that bisects instead of walking.

    `default_capacity` (index blocks, >= 1) applies to replicas without `set_capacity`. Replica names
    are arbitrary strings; a replica enters the index on its first `record` or `set_capacity`.
    """

    def __init__(self, default_capacity: int) -> None:
        if default_capacity < 1:
            raise ValueError(f"default_capacity must be at least 1, got {default_capacity}")
        self._default_capacity = default_capacity
        self._owners: dict[int, int] = {}  # key -> bitmask of slots believed to hold it
        self._slots: dict[str, int] = {}  # replica -> slot
        self._names: list[str] = []  # slot -> replica ("" = free; a free slot's bit is in no mask)
        self._bits: list[int] = []  # slot -> 1 << slot; shared objects, so one-owner keys cost no int
        self._lrus: list[_KeyLru] = []  # slot -> its keys
        self._capacity: list[int] = []  # slot -> capacity in index blocks
        self._free: list[int] = []  # free slots, reused so masks stay narrow
        # Candidate list -> mask of their slots. The gateway asks about the same pools over and over;
        # cleared whenever a slot changes hands, and when it grows past _MASK_CACHE entries.
        self._pool_masks: dict[tuple[str, ...], int] = {}

    # -- capacity and membership -------------------------------------------------------------------

    def set_capacity(self, replica: str, capacity_blocks: int) -> None:
        """Set `replica`'s capacity in index blocks (>= 0); shrinking evicts least recent keys now."""
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        slot = self._slot(replica)
        self._capacity[slot] = capacity_blocks
        self._evict(slot)

    def capacity(self, replica: str) -> int:
        """`replica`'s capacity in index blocks (the default for a replica the index has not seen)."""
        slot = self._slots.get(replica)
        return self._default_capacity if slot is None else self._capacity[slot]

    def remove_replica(self, replica: str) -> None:
        """Forget `replica` and every key it held; its slot is reused. No-op when unknown."""
        slot = self._slots.pop(replica, None)
        if slot is None:
            return
        clear = ~self._bits[slot]
        owners = self._owners
        for key in self._lrus[slot].oldest_first():
            mask = owners[key] & clear
            if mask:
                owners[key] = mask
            else:
                del owners[key]
        self._lrus[slot] = _KeyLru()
        self._names[slot] = ""
        self._capacity[slot] = 0
        self._free.append(slot)
        self._pool_masks.clear()

    def clear(self) -> None:
        """Forget every key; replicas keep their slots and capacities."""
        self._owners.clear()
        self._lrus = [_KeyLru() for _ in self._lrus]

    # -- the hot path ------------------------------------------------------------------------------

    def record(self, replica: str, keys: Sequence[int]) -> None:
        """`keys` (a request's leading block keys, in order) were dispatched to `replica`.

        Each key becomes most recent, the first key most recent of all; keys beyond the replica's
        capacity are not recorded; least recent keys are evicted down to capacity.
        """
        slot = self._slot(replica)
        capacity = self._capacity[slot]
        if len(keys) > capacity:
            keys = keys[:capacity]
        lru = self._lrus[slot]
        young = lru.young
        old = lru.old
        owners = self._owners
        bit = self._bits[slot]
        for key in reversed(keys):
            # Values are None, so a pop that returns None found the key: refresh it (to the end of
            # young); otherwise it is new to this replica.
            if young.pop(key, _ABSENT) is None or old.pop(key, _ABSENT) is None:
                young[key] = None
            else:
                young[key] = None
                mask = owners.get(key)
                owners[key] = bit if mask is None else mask | bit
        if len(lru) > capacity:
            self._evict(slot)

    def match(self, keys: Sequence[int], replicas: Iterable[str]) -> dict[str, int]:
        """How many of `keys`' leading blocks each of `replicas` is believed to hold.

        `keys` are one prompt's chained block keys (`policies.prefix`), in order. The result is
        sparse: it names only the replicas that hold at least the first block; every other replica
        holds none (read it with `.get(name, 0)`). A replica's count stops at the first key it lacks.

        Cost: the set of candidates holding key i can only shrink as i grows (see the class
        docstring), so the index bisects for the points where it shrinks instead of walking every
        key: about (distinct drop-out points) x log2(len(keys)) dict lookups, and never more than
        len(keys), whatever the number of replicas. This matters because each lookup in a large
        index is a few cache misses.
        """
        result: dict[str, int] = {}
        if not keys:
            return result
        pool = replicas if isinstance(replicas, tuple) else tuple(replicas)
        mask = self._pool_masks.get(pool)
        if mask is None:
            mask = self._pool_mask(pool)
        get = self._owners.get
        first = get(keys[0], 0) & mask
        if not first:
            return result
        names = self._names
        last = len(keys) - 1
        # Holders of the last key hold them all; `& first` keeps the sets nested even if a caller
        # broke the prefix invariant (the answer is then approximate, never out of range).
        held_all = get(keys[last], 0) & first if last else first
        bits = held_all
        while bits:
            low = bits & -bits
            bits ^= low
            result[names[low.bit_length() - 1]] = last + 1
        # Intervals (lo, hi, holders of keys[lo], holders of keys[hi]) with holders(lo) > holders(hi):
        # the difference drops out somewhere in (lo, hi]. Each index is probed at most once.
        pending = [(0, last, first, held_all)] if first != held_all else []
        while pending:
            lo, hi, at_lo, at_hi = pending.pop()
            if hi - lo == 1:
                bits = at_lo & ~at_hi
                while bits:
                    low = bits & -bits
                    bits ^= low
                    result[names[low.bit_length() - 1]] = hi
                continue
            mid = (lo + hi) >> 1
            at_mid = get(keys[mid], 0) & at_lo
            if at_mid != at_lo:
                pending.append((lo, mid, at_lo, at_mid))
            if at_mid != at_hi:
                pending.append((mid, hi, at_mid, at_hi))
        return result

    # -- introspection -----------------------------------------------------------------------------

    def size(self) -> int:
        """Distinct keys held by any replica."""
        return len(self._owners)

    def replica_sizes(self) -> dict[str, int]:
        """Keys held per replica (each at most its capacity)."""
        return {name: len(self._lrus[slot]) for name, slot in self._slots.items()}

    def entries(self) -> int:
        """(replica, key) pairs: the sum of `replica_sizes()`."""
        return sum(len(lru) for lru in self._lrus)

    def estimated_bytes(self) -> int:
        """Approximate memory held by the index's containers and key objects, in bytes.

        Counts the dicts and arrays (`sys.getsizeof`) and one int object per distinct key; masks of
        several owners add a few bytes more.
        """
        key_object = sys.getsizeof(1 << 63)
        total = sys.getsizeof(self._owners) + len(self._owners) * key_object
        for lru in self._lrus:
            total += sys.getsizeof(lru.young) + sys.getsizeof(lru.old) + sys.getsizeof(lru.order)
        return total

    # -- internals ---------------------------------------------------------------------------------

    def _slot(self, replica: str) -> int:
        slot = self._slots.get(replica)
        if slot is not None:
            return slot
        if self._free:
            slot = self._free.pop()
            self._names[slot] = replica
            self._capacity[slot] = self._default_capacity
        else:
            slot = len(self._names)
            self._names.append(replica)
            self._bits.append(1 << slot)
            self._lrus.append(_KeyLru())
            self._capacity.append(self._default_capacity)
        self._slots[replica] = slot
        self._pool_masks.clear()
        return slot

    def _pool_mask(self, pool: tuple[str, ...]) -> int:
        slots = self._slots
        bits = self._bits
        mask = 0
        for name in pool:
            slot = slots.get(name)
            if slot is not None:
                mask |= bits[slot]
        if len(self._pool_masks) >= _MASK_CACHE:
            self._pool_masks.clear()
        self._pool_masks[pool] = mask
        return mask

    def _evict(self, slot: int) -> None:
        lru = self._lrus[slot]
        excess = len(lru) - self._capacity[slot]
        if excess <= 0:
            return
        owners = self._owners
        clear = ~self._bits[slot]
        pop = lru.pop_oldest
        for _ in range(excess):
            key = pop()
            mask = owners[key] & clear
            if mask:
                owners[key] = mask
            else:
                del owners[key]
