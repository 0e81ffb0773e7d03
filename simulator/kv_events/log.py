"""The KV-cache events one engine has produced and not yet handed out (vLLM's `kv_event_queue`).

The block manager records into it as it works: `stored` when a request's newly full blocks become
findable (one event per request and step, the chain of its new blocks), `removed` when a cached block
is taken for new tokens and its key forgotten (one event per block, as vLLM sends), `cleared` when the
whole prefix cache is reset. The driver takes them once per engine step (`take`) and publishes them as
one batch, or nothing when there are none.

One difference from vLLM, where the simulator's cache is simpler: vLLM keeps a duplicate block (full,
with the same hash as a cached one, e.g. a prompt's last block recomputed on a hit, or two requests'
identical output) findable as a second copy, publishes a `BlockStored` for it and a `BlockRemoved` for
each copy evicted, so one hash can be stored twice before it is removed twice. The simulator keeps
one block per key, publishes nothing for the duplicate (a chain is split around it: the next event's
parent is the duplicate's hash, which the first copy holds) and removes a hash once. Its events stay
exactly its cache; a consumer written for vLLM should count copies per hash.

Pure bookkeeping, no I/O; owned by one engine. Nothing is recorded while nobody listens: the engine
makes a log only when events are enabled.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.kv_events.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, external_hash


class KVEventLog:
    """Events in the order they happened, until `take`n."""

    __slots__ = ("_events", "block_size")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._events: list[KVEvent] = []

    def __len__(self) -> int:
        return len(self._events)

    def stored(
        self,
        keys: Sequence[int],
        parent: int | None,
        token_ids: Sequence[int],
        lora_name: str | None = None,
        lora_id: int | None = None,
    ) -> None:
        """Blocks with `keys` (a chain: each key's parent is the one before, the first's is `parent`,
        None for a sequence's first block) holding `token_ids` (`block_size` per key)."""
        if len(token_ids) != len(keys) * self.block_size:
            raise ValueError(f"{len(token_ids)} tokens for {len(keys)} blocks of {self.block_size}")
        per_block = None if lora_name is None else (lora_name,)
        self._events.append(BlockStored(
            block_hashes=tuple(map(external_hash, keys)),
            parent_block_hash=None if parent is None else external_hash(parent),
            token_ids=tuple(token_ids),
            block_size=self.block_size,
            lora_id=lora_id,
            lora_name=lora_name,
            extra_keys=(per_block,) * len(keys),
        ))  # fmt: skip

    def removed(self, key: int) -> None:
        self._events.append(BlockRemoved(block_hashes=(external_hash(key),)))

    def cleared(self) -> None:
        self._events.append(AllBlocksCleared())

    def take(self) -> list[KVEvent]:
        """Every event since the last call, oldest first; the log is then empty."""
        events, self._events = self._events, []
        return events
