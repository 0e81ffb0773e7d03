"""kvgate's ids are the engine's: the tokenizer and chat template vLLM 0.32 served the captured requests
with, loaded from their files, reproduce the `token_ids` of every full block the engine stored for them
(tests/fixtures/vllm-0.32-cpu/kv_events, requests described in tiny-llama-tokenizer/README.md).

The chains are rebuilt from the events alone (each BlockStored event's blocks in order, the first one's
parent `parent_block_hash`), so nothing here chooses which chain a request "should" match: each of the
nine requests must match exactly one of the nine chains the engine stored, each chain matched once, in
the order the requests were sent. Then the same through kvgate's own exact index, fed the captured
frames: what a request matches is what the engine holds of it."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from gateway.config import parse_config
from gateway.kv_events.feed import ReplicaFeed
from gateway.routing import Router
from gateway.tokenizers import full_blocks, prompt_ids, tokenizer_for
from policies.exact_index import ExactIndex
from policies.exact_keys import lazy_request_keys
from tests.gateway.kv_events.captured import captured
from tests.vllm_fixtures import VLLM_FIXTURES

TOKENIZER_DIR = VLLM_FIXTURES / "tiny-llama-tokenizer"
EVENTS = VLLM_FIXTURES / "kv_events"
BLOCK = 32  # the server's --block-size
MODEL = "tiny-llama"

SYSTEM = "You are a helpful assistant for the ACME company. Answer briefly and politely. " + "".join(
    f"Policy clause {n} applies. " for n in range(1, 41)
)
CHATS = [
    {"model": MODEL, "max_tokens": 40, "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Question number {k} about the policy?"},
    ]}
    for k in (1, 2, 3)
]  # fmt: skip
COMPLETIONS = [
    {"model": MODEL, "max_tokens": 8, "prompt": "".join(f"t{i} w{j} " for j in range(1, 111))}
    for i in range(1, 7)
]


def stored_chains(*files: Path) -> list[list[list[int]]]:
    """Every root-to-leaf chain of stored blocks (as token-id lists), in the order their last block
    was stored."""
    parent: dict[int, int | None] = {}
    tokens: dict[int, list[int]] = {}
    order: list[int] = []
    for file in files:
        for line in file.read_text().splitlines():
            _ts, events, _rank = json.loads(line)["decoded"]
            for e in events:
                if e["type"] != "BlockStored":
                    continue
                assert e["block_size"] == BLOCK and len(e["token_ids"]) == BLOCK * len(e["block_hashes"])
                up = e["parent_block_hash"]
                for i, h in enumerate(e["block_hashes"]):
                    parent[h], tokens[h] = up, e["token_ids"][i * BLOCK : (i + 1) * BLOCK]
                    order.append(h)
                    up = h
    has_child = {p for p in parent.values() if p is not None}
    chains = []
    for leaf in (h for h in order if h not in has_child):
        chain: list[list[int]] = []
        node: int | None = leaf
        while node is not None:
            chain.append(tokens[node])
            node = parent[node]
        chains.append(chain[::-1])
    return chains


@pytest.fixture(scope="module")
def tok() -> Any:
    return tokenizer_for(str(TOKENIZER_DIR))


@pytest.mark.parametrize(
    ("endpoint", "requests", "events"),
    [("chat", CHATS, "stored.jsonl"), ("completions", COMPLETIONS, "evicted.jsonl")],
)
def test_full_blocks_equal_the_engines_stored_token_ids(
    tok: Any, endpoint: str, requests: list[dict[str, Any]], events: str
) -> None:
    chains = stored_chains(EVENTS / events)
    assert len(chains) == len(requests)  # one chain per request in this capture
    matched = []
    for body in requests:
        ids = prompt_ids(tok, endpoint, body)
        blocks = full_blocks(ids, BLOCK)
        assert blocks, "every captured prompt fills blocks"
        hits = [i for i, chain in enumerate(chains) if chain[: len(blocks)] == blocks]
        assert len(hits) == 1, (endpoint, len(ids), hits)
        chain = chains[hits[0]]
        # The prompt's partial tail starts the engine's next block (then come generated tokens).
        tail = ids[len(blocks) * BLOCK :]
        if len(chain) > len(blocks):
            assert chain[len(blocks)][: len(tail)] == tail
        matched.append(hits[0])
    assert matched == sorted(set(matched))  # each chain once, in the order the requests were sent


def test_the_capture_is_what_the_readme_says(tok: Any) -> None:
    """The shapes the test above relies on: chat prompts open with BOS (from the template, not from
    add_special_tokens) and fill 26 blocks; completion prompts get no BOS from this tokenizer (its
    post-processor adds none) and fill 17."""
    chat = prompt_ids(tok, "chat", CHATS[0])
    assert chat[0] == 1 and chat.count(1) == 1 and len(chat) // BLOCK == 26
    completion = prompt_ids(tok, "completions", COMPLETIONS[0])
    assert 1 not in completion and len(completion) // BLOCK == 17
    assert completion == tok.encode_text(COMPLETIONS[0]["prompt"], add_special_tokens=False)


# --- through kvgate's exact index -----------------------------------------------------------------------


def engine_chains(name: str) -> list[list[int]]:
    """Each root-to-leaf chain of the capture as engine hashes, in the order its last block was stored."""
    parent: dict[int, int | None] = {}
    order: list[int] = []
    for m in captured(name):
        for e in m.decoded[1]:
            if e["type"] == "BlockStored":
                up = e["parent_block_hash"]
                for h in e["block_hashes"]:
                    parent[h], up = up, h
                    order.append(h)
    has_child = {p for p in parent.values() if p is not None}
    chains = []
    for leaf in (h for h in order if h not in has_child):
        chain, node = [], leaf
        while node is not None:
            chain.append(node)
            node = parent[node]
        chains.append(chain[::-1])
    return chains


def test_the_exact_index_fed_the_captured_frames_matches_requests_tokenized_here() -> None:
    """The whole path: the captured ZeroMQ frames through kvgate's KV-event feed into its exact index,
    requests through the Router with this tokenizer (its packed ids keyed at the engine's block size):
    each chat request matches all 26 of its prompt blocks; after the evictions each completion matches
    exactly the leading blocks of its chain the engine still holds (the last one all 17)."""
    index = ExactIndex(default_capacity=64)
    index.add_replica("r0", MODEL, capacity=64)  # the server's --num-gpu-blocks-override
    feed = ReplicaFeed("r0", index, can_replay=False, stale_after_s=60)
    router = Router(
        parse_config({"models": [{"name": MODEL, "tokenizer": str(TOKENIZER_DIR)}]}), random.Random(1)
    )

    def matched(endpoint: str, body: dict[str, Any]) -> int:
        facts = router.prompt_facts(endpoint, body, MODEL, None)
        return index.match(lazy_request_keys(facts.token_bytes, BLOCK, MODEL, None), ("r0",)).get("r0", 0)

    for m in captured("stored"):
        feed.on_live(m.frames, 0.0)
    assert feed.exact(0.0)
    assert [matched("chat", body) for body in CHATS] == [26, 26, 26]
    for m in captured("evicted"):
        feed.on_live(m.frames, 0.0)
    held = index.held_hashes("r0")
    still = []
    for chain in engine_chains("evicted"):
        n = 0
        while n < len(chain) and chain[n] in held:
            n += 1
        still.append(n)
    assert still[-1] == 17 and still[0] == 0  # the capture's evictions: the newest whole, the oldest gone
    assert [matched("completions", body) for body in COMPLETIONS] == still
