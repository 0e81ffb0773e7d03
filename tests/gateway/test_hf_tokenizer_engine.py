"""kvgate's ids are the engine's: the tokenizer and chat template vLLM 0.32 served the captured requests
with, loaded from their files, reproduce the `token_ids` of every full block the engine stored for them
(tests/fixtures/vllm-0.32-cpu/kv_events, requests described in tiny-llama-tokenizer/README.md).

The chains are rebuilt from the events alone (each BlockStored event's blocks in order, the first one's
parent `parent_block_hash`), so nothing here chooses which chain a request "should" match: each of the
nine requests must match exactly one of the nine chains the engine stored, each chain matched once, in
the order the requests were sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.tokenizers import full_blocks, prompt_ids, tokenizer_for
from tests.vllm_fixtures import VLLM_FIXTURES

TOKENIZER_DIR = VLLM_FIXTURES / "tiny-llama-tokenizer"
EVENTS = VLLM_FIXTURES / "kv_events"
BLOCK = 32  # the server's --block-size

SYSTEM = "You are a helpful assistant for the ACME company. Answer briefly and politely. " + "".join(
    f"Policy clause {n} applies. " for n in range(1, 41)
)
CHATS = [
    {"model": "tiny-llama", "max_tokens": 40, "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Question number {k} about the policy?"},
    ]}
    for k in (1, 2, 3)
]  # fmt: skip
COMPLETIONS = [
    {"model": "tiny-llama", "max_tokens": 8, "prompt": "".join(f"t{i} w{j} " for j in range(1, 111))}
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
