"""Which blocks each replica's engine holds, exactly, as its KV events said.

Fed by the gateway's KV-event subscribers (gateway/kv_events/): `store` for a BlockStored, `remove`
for a BlockRemoved, `reset` for AllBlocksCleared, a restarted engine or events lost for good. Blocks
are kept under kvgate's own keys (`policies.exact_keys`): a BlockStored names its parent by the
engine's hash, so each replica keeps `engine hash -> own key` for the blocks it holds, and a block
whose parent it does not hold cannot be keyed (its events were missed): it is counted and the
replica's index is marked incomplete.

Complete or not. A replica's index is `complete` when it has seen every event since a moment the
engine's cache was known: the engine's first batch (sequence 0), or an AllBlocksCleared. A reset after
lost events, or an unkeyable store, makes it incomplete. It is rebuilt by the events themselves and
counts as complete again once it has keyed, with no unkeyable store in between, as many blocks as the
engine's whole cache (`capacity`). That is a bound, not a proof: a block the engine stored before the
break and has kept since (a hot system prompt) stays unknown until it is evicted and stored again. But
such a block is a parent: the blocks stored after it are unkeyable, and each unkeyable store restarts
the count, so a replica whose hot prefix is unknown stays incomplete. A busy engine turns its cache
over quickly; a quiet one may stay incomplete, on the approximate index, where it loses little.

Bounded by the engine: an engine holds at most `num_gpu_blocks` blocks (each physical copy of a hash
counts: the engine may hold two copies, and says BlockStored twice and BlockRemoved twice), so a
replica holding more than its capacity has missed removals: `store` resets it, incomplete. Before
the capacity is known, `default_capacity` bounds it.

Structure: as `policies.prefix_index`, each replica has a slot (a bit) and `_owners` maps an own key
to the mask of slots holding it, so one walk of a request's keys answers for every candidate. Only
dicts of ints: the garbage collector never traverses them.

Concurrency: none; one event loop owns an index. Pure logic: no I/O, no clock.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.exact_keys import chain_keys, pack_tokens, plain_extra
from policies.prefix import seed_for

_MASK_CACHE = 64


class Stored(enum.Enum):
    OK = "ok"
    UNKEYABLE = "unkeyable"  # the parent is not held: blocks counted, not stored; index incomplete
    OVERFLOW = "overflow"  # more blocks than the engine can hold: removals were missed; reset
    BLOCK_SIZE = "block_size"  # the engine's block size changed: a new engine; reset


@dataclass(slots=True)
class _Replica:
    model: str
    capacity: int
    engine: dict[int, int] = field(default_factory=dict)  # engine hash -> own key
    copies: dict[int, int] = field(default_factory=dict)  # engine hash -> extra physical copies
    shared: dict[int, int] = field(default_factory=dict)  # own key -> extra engine hashes naming it
    size: int = 0  # physical blocks held: len(engine) + sum(copies)
    block_size: int | None = None  # tokens per block, from the events
    complete: bool = False
    run: int = 0  # blocks keyed since the index became incomplete, with no unkeyable store between


class ExactIndex:
    """Per-replica engine blocks under kvgate's keys, and a longest-held-prefix match.

    A replica enters with `add_replica` (incomplete and empty until its events say more).
    """

    def __init__(self, default_capacity: int) -> None:
        if default_capacity < 1:
            raise ValueError(f"default_capacity must be at least 1, got {default_capacity}")
        self._default_capacity = default_capacity
        self._owners: dict[int, int] = {}  # own key -> mask of slots holding it
        self._slots: dict[str, int] = {}
        self._names: list[str] = []  # slot -> replica ("" = free)
        self._bits: list[int] = []
        self._replicas: list[_Replica | None] = []
        self._free: list[int] = []
        self._pool_masks: dict[tuple[str, ...], int] = {}

    # -- membership --------------------------------------------------------------------------------

    def add_replica(self, replica: str, model: str, capacity: int = 0) -> None:
        """Start (or start over) `replica`'s picture, empty and incomplete; capacity 0 = unknown."""
        self.remove_replica(replica)
        if self._free:
            slot = self._free.pop()
            self._names[slot] = replica
        else:
            slot = len(self._names)
            self._names.append(replica)
            self._bits.append(1 << slot)
            self._replicas.append(None)
        self._replicas[slot] = _Replica(model, capacity if capacity > 0 else self._default_capacity)
        self._slots[replica] = slot
        self._pool_masks.clear()

    def remove_replica(self, replica: str) -> None:
        slot = self._slots.pop(replica, None)
        if slot is None:
            return
        self._drop_blocks(slot)
        self._replicas[slot] = None
        self._names[slot] = ""
        self._free.append(slot)
        self._pool_masks.clear()

    def set_capacity(self, replica: str, capacity: int) -> None:
        """The engine's real block count (`num_gpu_blocks`); a picture already larger is reset."""
        rep = self._get(replica)
        if rep is None or capacity <= 0:
            return
        rep.capacity = capacity
        if rep.size > capacity:
            self.reset(replica, complete=False)

    def reset(self, replica: str, *, complete: bool) -> None:
        """Forget the replica's blocks. `complete`: the engine's cache is known to be empty now (an
        AllBlocksCleared, a restarted engine), else the picture is incomplete until rebuilt."""
        slot = self._slots.get(replica)
        if slot is None:
            return
        self._drop_blocks(slot)
        rep = self._replicas[slot]
        assert rep is not None
        rep.complete = complete
        rep.run = 0

    def mark_incomplete(self, replica: str) -> None:
        rep = self._get(replica)
        if rep is not None:
            rep.complete = False
            rep.run = 0

    # -- events ------------------------------------------------------------------------------------

    def store(
        self,
        replica: str,
        parent: int | None,
        block_hashes: Sequence[int],
        token_ids: Sequence[int],
        block_size: int,
        lora_name: str | None = None,
        lora_id: int | None = None,
        extra_keys: Sequence[Any] | None = None,
    ) -> Stored:
        """A BlockStored: `block_hashes[i]` (the engine's) holds tokens `i*block_size` onward."""
        slot = self._slots.get(replica)
        if slot is None:
            return Stored.OK
        rep = self._replicas[slot]
        assert rep is not None
        if rep.block_size != block_size:
            if rep.block_size is not None:
                self.reset(replica, complete=False)
                rep.block_size = block_size
                return Stored.BLOCK_SIZE
            rep.block_size = block_size
        if parent is None:
            start = seed_for(rep.model, lora_name)
        else:
            found = rep.engine.get(parent)
            if found is None:
                rep.complete = False
                rep.run = 0
                return Stored.UNKEYABLE
            start = found
        extras = None
        if extra_keys is not None and extra_keys.count(None) != len(extra_keys):
            extras = [plain_extra(e, lora_name, lora_id) for e in extra_keys]
        keys = chain_keys(pack_tokens(token_ids), block_size, start, extras)
        owners = self._owners
        bit = self._bits[slot]
        engine = rep.engine
        for h, key in zip(block_hashes, keys, strict=False):
            if h in engine:
                rep.copies[h] = rep.copies.get(h, 0) + 1
            else:
                engine[h] = key
                mask = owners.get(key, 0)
                if mask & bit:
                    rep.shared[key] = rep.shared.get(key, 0) + 1
                else:
                    owners[key] = mask | bit
            rep.size += 1
        if rep.size > rep.capacity:
            self.reset(replica, complete=False)
            return Stored.OVERFLOW
        if not rep.complete:
            rep.run += len(keys)
            if rep.run >= rep.capacity:
                rep.complete = True
        return Stored.OK

    def remove(self, replica: str, block_hashes: Iterable[int]) -> int:
        """A BlockRemoved; returns how many of the hashes the replica was not known to hold."""
        slot = self._slots.get(replica)
        if slot is None:
            return 0
        rep = self._replicas[slot]
        assert rep is not None
        unknown = 0
        owners = self._owners
        clear = ~self._bits[slot]
        for h in block_hashes:
            extra = rep.copies.get(h)
            if extra is not None:
                if extra > 1:
                    rep.copies[h] = extra - 1
                else:
                    del rep.copies[h]
                rep.size -= 1
                continue
            key = rep.engine.pop(h, None)
            if key is None:
                unknown += 1
                continue
            rep.size -= 1
            shared = rep.shared.get(key)
            if shared is not None:
                if shared > 1:
                    rep.shared[key] = shared - 1
                else:
                    del rep.shared[key]
                continue
            mask = owners.get(key, 0) & clear
            if mask:
                owners[key] = mask
            else:
                owners.pop(key, None)
        return unknown

    # -- matching ----------------------------------------------------------------------------------

    def match(self, keys: Iterable[int], replicas: Iterable[str]) -> dict[str, int]:
        """Leading blocks of `keys` (`exact_keys.request_keys` at these replicas' block size, or
        `lazy_request_keys`) each of `replicas` holds; sparse, as `PrefixIndex.match`. Walks the keys
        until no candidate holds one: O(longest match) lookups, whatever the number of replicas, and a
        lazy `keys` is consumed no further."""
        result: dict[str, int] = {}
        pool = replicas if isinstance(replicas, tuple) else tuple(replicas)
        mask = self._pool_masks.get(pool)
        if mask is None:
            mask = self._pool_mask(pool)
        get = self._owners.get
        names = self._names
        n = -1
        for n, key in enumerate(keys):
            held = get(key, 0) & mask
            if held == mask:  # the usual step: every candidate still in holds this block too
                continue
            gone = mask & ~held
            while gone:
                low = gone & -gone
                gone ^= low
                if n:
                    result[names[low.bit_length() - 1]] = n
            mask = held
            if not mask:
                return result
        if n < 0:  # no keys
            return result
        while mask:
            low = mask & -mask
            mask ^= low
            result[names[low.bit_length() - 1]] = n + 1
        return result

    # -- introspection -----------------------------------------------------------------------------

    def complete(self, replica: str) -> bool:
        rep = self._get(replica)
        return rep is not None and rep.complete

    def block_size(self, replica: str) -> int | None:
        """The engine's block size as its events give it (None before its first BlockStored)."""
        rep = self._get(replica)
        return None if rep is None else rep.block_size

    def blocks(self, replica: str) -> int:
        """Physical blocks the replica is known to hold."""
        rep = self._get(replica)
        return 0 if rep is None else rep.size

    def capacity(self, replica: str) -> int:
        rep = self._get(replica)
        return self._default_capacity if rep is None else rep.capacity

    def held_hashes(self, replica: str) -> set[int]:
        """The engine hashes the replica holds (tests and debugging; O(blocks))."""
        rep = self._get(replica)
        return set() if rep is None else set(rep.engine)

    def replicas(self) -> tuple[str, ...]:
        return tuple(self._slots)

    def estimated_bytes(self) -> int:
        """Memory held by the containers and their int objects, approximately (as PrefixIndex's)."""
        big_int = sys.getsizeof(1 << 63)
        total = sys.getsizeof(self._owners) + len(self._owners) * big_int
        for rep in self._replicas:
            if rep is not None:
                total += sys.getsizeof(rep.engine) + len(rep.engine) * big_int
                total += sys.getsizeof(rep.copies) + sys.getsizeof(rep.shared)
        return total

    # -- internals ---------------------------------------------------------------------------------

    def _get(self, replica: str) -> _Replica | None:
        slot = self._slots.get(replica)
        return None if slot is None else self._replicas[slot]

    def _drop_blocks(self, slot: int) -> None:
        rep = self._replicas[slot]
        assert rep is not None
        owners = self._owners
        clear = ~self._bits[slot]
        for key in rep.engine.values():
            mask = owners.get(key, 0) & clear
            if mask:
                owners[key] = mask
            else:
                owners.pop(key, None)
        rep.engine = {}
        rep.copies = {}
        rep.shared = {}
        rep.size = 0

    def _pool_mask(self, pool: tuple[str, ...]) -> int:
        mask = 0
        for name in pool:
            slot = self._slots.get(name)
            if slot is not None:
                mask |= self._bits[slot]
        if len(self._pool_masks) >= _MASK_CACHE:
            self._pool_masks.clear()
        self._pool_masks[pool] = mask
        return mask
