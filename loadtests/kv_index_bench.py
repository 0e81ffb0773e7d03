"""Exact KV index benchmark: memory per replica, CPU per KV event, and the request-side match.

    python -m loadtests.kv_index_bench [--blocks 25000] [--block-size 16] [--requests 3000]
                                       [--step-requests 8] [--seed 1]

A stand-in engine (a prefix cache of `--blocks` blocks, least recently used evicted first, as vLLM
frees them) serves chat-like requests: one of 20 shared system prompts of 1,024 tokens, a 1,024-token
user part of its own and 256 generated tokens. Each request produces the events vLLM would: a
BlockStored of its new prompt blocks (parent = the last cached one), a BlockStored per generated full
block, and a BlockRemoved for every block evicted to make room. vLLM publishes one batch per engine
step, whatever the requests in it; here a batch holds the events of `--step-requests` requests. The
messages are encoded as vLLM 0.32 encodes them (msgpack, tagged maps) before anything is timed.

Timed (thread CPU time, garbage collector on): every message through `ReplicaFeed.on_live` (decode,
sequence check, index update), per request served and per block event (a block stored or removed),
and what that is at 20 requests a second per replica; and the
request side of routing, `lazy_request_keys` at the engine's block size plus `ExactIndex.match` for a
prompt of 2,048 + 1,024 tokens against 1 and 16 replicas. Memory: tracemalloc of the index holding a
full engine cache (`--blocks` blocks) for one replica, against an empty index.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import time
import tracemalloc
from collections import OrderedDict
from typing import Any

import msgpack
import xxhash

from gateway.kv_events.feed import ReplicaFeed
from gateway.kv_events.wire import encode_seq
from policies.exact_index import ExactIndex
from policies.exact_keys import lazy_request_keys, pack_tokens

VOCAB = 128_000
SYSTEM_PROMPTS = 20
SYSTEM_TOKENS = 1024
USER_TOKENS = 1024
OUTPUT_TOKENS = 256
MODEL = "llama"


class Engine:
    """A prefix cache that numbers its messages like vLLM and says what it stored and evicted."""

    def __init__(self, blocks: int, block_size: int, step_requests: int = 1) -> None:
        self.step_requests = step_requests
        self.pending: list[dict[str, Any]] = []
        self.served = 0
        self.capacity = blocks
        self.block_size = block_size
        self.cache: OrderedDict[int, None] = OrderedDict()  # engine hash -> None, least recent first
        self.seq = 0
        self.messages: list[list[bytes]] = []
        self.events = 0  # block events (a block stored or removed)

    def serve(self, tokens: list[int], generated: list[int]) -> None:
        bs = self.block_size
        parent: int | None = None
        hashes: list[int] = []
        for i in range(len(tokens) // bs):
            block = tokens[i * bs : (i + 1) * bs]
            h = xxhash.xxh3_64_intdigest(pack_tokens(block), parent or 0)
            hashes.append(h)
            parent = h
        cached = 0
        while cached < len(hashes) and hashes[cached] in self.cache:
            self.cache.move_to_end(hashes[cached])
            cached += 1
        new = hashes[cached:]
        events: list[dict[str, Any]] = self._evict(len(new))
        if new:
            events.append(
                self._stored(
                    new, hashes[cached - 1] if cached else None, tokens[cached * bs : len(hashes) * bs]
                )
            )
            for h in new:
                self.cache[h] = None
        self._publish(events)
        tail = tokens[len(hashes) * bs :]
        last = hashes[-1] if hashes else None
        for t in generated:  # a BlockStored each time a generated block fills
            tail.append(t)
            if len(tail) == bs:
                h = xxhash.xxh3_64_intdigest(pack_tokens(tail), last or 0)
                events = self._evict(1)
                events.append(self._stored([h], last, tail))
                self.cache[h] = None
                self._publish(events)
                last, tail = h, []
        self.served += 1
        if self.served % self.step_requests == 0:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            payload = msgpack.packb([time.time(), self.pending, 0])
            self.messages.append([b"kv", encode_seq(self.seq), payload])
            self.seq += 1
            self.pending = []

    def _evict(self, room: int) -> list[dict[str, Any]]:
        out = []
        while len(self.cache) + room > self.capacity:
            h, _ = self.cache.popitem(last=False)
            out.append({"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": 0})
        self.events += len(out)
        return out

    def _stored(self, hashes: list[int], parent: int | None, tokens: list[int]) -> dict[str, Any]:
        self.events += len(hashes)
        return {
            "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": self.block_size, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": [None] * len(hashes), "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        }  # fmt: skip

    def _publish(self, events: list[dict[str, Any]]) -> None:
        self.pending += events


def workload(rng: random.Random, requests: int) -> list[tuple[list[int], list[int]]]:
    systems = [[rng.randrange(VOCAB) for _ in range(SYSTEM_TOKENS)] for _ in range(SYSTEM_PROMPTS)]
    out = []
    for _ in range(requests):
        prompt = rng.choice(systems) + [rng.randrange(VOCAB) for _ in range(USER_TOKENS)]
        out.append((prompt, [rng.randrange(VOCAB) for _ in range(OUTPUT_TOKENS)]))
    return out


def feed_cpu(messages: list[list[bytes]], blocks: int) -> tuple[list[int], ReplicaFeed]:
    index = ExactIndex(blocks)
    index.add_replica("r", MODEL, blocks)
    feed = ReplicaFeed("r", index, can_replay=True, stale_after_s=10)
    costs = []
    clock = time.thread_time_ns
    for frames in messages:
        t = clock()
        feed.on_live(frames, 0.0)
        costs.append(clock() - t)
    return costs, feed


def index_memory(messages: list[list[bytes]], blocks: int) -> int:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    _, feed = feed_cpu(messages, blocks)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del feed
    return used


def match_cost(rng: random.Random, block_size: int, replicas: int, n: int = 300, cold: bool = False) -> float:
    """Mean µs of the keys + match for a 3k-token prompt held in full by one of `replicas` (`cold`:
    by none of them)."""
    index = ExactIndex(100_000)
    names = tuple(f"r{i}" for i in range(replicas))
    for name in names:
        index.add_replica(name, MODEL, 100_000)
    prompts = []
    for i in range(20):
        ids = [rng.randrange(VOCAB) for _ in range(3 * 1024)]
        blocks = len(ids) // block_size
        index.store(
            names[i % replicas],
            None,
            list(range(i * 10_000, i * 10_000 + blocks)),
            ids[: blocks * block_size],
            block_size,
        )
        prompts.append(pack_tokens(ids))
    clock = time.thread_time_ns
    total = 0
    if cold:
        prompts = [pack_tokens([rng.randrange(VOCAB) for _ in range(3 * 1024)]) for _ in range(20)]
    for k in range(n):
        packed = prompts[k % len(prompts)]
        t = clock()
        keys = lazy_request_keys(packed, block_size, MODEL, None)
        index.match(keys, names)
        total += clock() - t
    return total / n / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=25_000, help="engine blocks (num_gpu_blocks)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--step-requests", type=int, default=8, help="requests whose events share a batch")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    engine = Engine(args.blocks, args.block_size, args.step_requests)
    for prompt, generated in workload(rng, args.requests):
        engine.serve(prompt, generated)
    engine.flush()
    msgs = engine.messages
    print(f"load average {os.getloadavg()[0]:.2f}; {len(msgs)} messages, {engine.events} block events")

    costs, feed = feed_cpu(msgs, args.blocks)
    total_us = sum(costs) / 1000
    held = feed.index.blocks("r")
    print(f"index after the stream: {held} blocks held (engine {len(engine.cache)}), unkeyable "
          f"{feed.unkeyable}, complete {feed.index.complete('r')}")  # fmt: skip
    per_request = total_us / args.requests
    print(f"CPU per message: median {statistics.median(costs) / 1000:.1f} us, "
          f"p99 {sorted(costs)[int(len(costs) * 0.99)] / 1000:.1f} us; per block event "
          f"{total_us / engine.events:.2f} us; per request served {per_request:.0f} us "
          f"({total_us / 1e6:.2f} s for the stream)")  # fmt: skip
    print(f"at 20 requests/s per replica: {20 * per_request / 1e4:.2f}% of a core per replica, "
          f"{64 * 20 * per_request / 1e4:.0f}% for 64 replicas")  # fmt: skip
    used = index_memory(msgs, args.blocks)
    print(f"memory of one replica's full index ({held} blocks): {used / 1e6:.1f} MB, "
          f"{used / max(1, held):.0f} bytes per block")  # fmt: skip
    for replicas in (1, 16):
        print(f"request side, 3,072-token prompt at {args.block_size}-token blocks, {replicas} replicas: "
              f"{match_cost(rng, args.block_size, replicas):.1f} us (keys + match), cold prompt "
              f"{match_cost(rng, args.block_size, replicas, cold=True):.1f} us")  # fmt: skip


if __name__ == "__main__":
    main()
