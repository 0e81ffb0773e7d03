"""kvgate's own block keys agree between an engine's events and a request, and keep apart what the
engine keeps apart (adapters, cache salts)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.tokenizers import SimTokenizer
from policies.exact_index import ExactIndex
from policies.exact_keys import (
    chain_keys,
    fold_token_id,
    lazy_request_keys,
    pack_tokens,
    plain_extra,
    request_keys,
)
from policies.prefix import seed_for
from simulator import tokenizer as sim_tokenizer

BS = 4


def tokens(n: int, start: int = 1) -> list[int]:
    return list(range(start, start + n))


def held(ids: list[int], *, lora: str | None = None, extras: list[Any] | None = None) -> ExactIndex:
    """An index whose replica "r" stored `ids` as one BlockStored chain from the root."""
    index = ExactIndex(1000)
    index.add_replica("r", "m", 1000)
    hashes = list(range(100, 100 + len(ids) // BS))
    index.store("r", None, hashes, ids, BS, lora_name=lora, extra_keys=extras)
    return index


def test_a_request_matches_the_blocks_an_event_stored_with_the_same_tokens() -> None:
    ids = tokens(5 * BS)
    index = held(ids)
    assert index.match(request_keys(pack_tokens(ids), BS, "m", None), ("r",)) == {"r": 5}
    longer = ids + tokens(3 * BS, start=500)
    assert index.match(request_keys(pack_tokens(longer), BS, "m", None), ("r",)) == {"r": 5}
    changed = [*ids[:9], 999, *ids[10:]]  # block 2 differs: blocks 0 and 1 still match
    assert index.match(request_keys(pack_tokens(changed), BS, "m", None), ("r",)) == {"r": 2}


def test_chains_continue_through_the_parents_key() -> None:
    ids = tokens(4 * BS)
    index = ExactIndex(1000)
    index.add_replica("r", "m", 1000)
    index.store("r", None, [1, 2], ids[: 2 * BS], BS)
    index.store("r", 2, [3, 4], ids[2 * BS :], BS)  # a later batch, naming its parent's engine hash
    assert index.match(request_keys(pack_tokens(ids), BS, "m", None), ("r",)) == {"r": 4}


def test_another_model_or_adapter_does_not_match() -> None:
    ids = tokens(3 * BS)
    packed = pack_tokens(ids)
    assert held(ids).match(request_keys(packed, BS, "other", None), ("r",)) == {}
    assert held(ids).match(request_keys(packed, BS, "m", "ad"), ("r",)) == {}
    # The engine puts the adapter's name at the head of every block's extra keys.
    lora = held(ids, lora="ad", extras=[("ad",)] * 3)
    assert lora.match(request_keys(packed, BS, "m", "ad"), ("r",)) == {"r": 3}
    assert lora.match(request_keys(packed, BS, "m", None), ("r",)) == {}


def test_a_cache_salt_separates_blocks_as_the_engine_does() -> None:
    ids = tokens(3 * BS)
    packed = pack_tokens(ids)
    salted = held(ids, extras=[("s1",), None, None])  # vLLM: the salt is in block 0's extra keys
    assert salted.match(request_keys(packed, BS, "m", None, "s1"), ("r",)) == {"r": 3}
    assert salted.match(request_keys(packed, BS, "m", None, "s2"), ("r",)) == {}
    assert salted.match(request_keys(packed, BS, "m", None), ("r",)) == {}
    both = held(ids, lora="ad", extras=[("ad", "s1"), ("ad",), ("ad",)])
    assert both.match(request_keys(packed, BS, "m", "ad", "s1"), ("r",)) == {"r": 3}


def test_blocks_with_extras_we_cannot_reproduce_do_not_match() -> None:
    ids = tokens(3 * BS)
    mm = held(ids, extras=[None, (("img-hash", 0),), None])  # a multimodal input in block 1
    assert mm.match(request_keys(pack_tokens(ids), BS, "m", None), ("r",)) == {"r": 1}


def test_plain_extra_takes_off_the_adapter_only_at_the_head() -> None:
    assert plain_extra(None, "ad", None) is None
    assert plain_extra(("ad",), "ad", None) is None
    assert plain_extra(("ad", "salt"), "ad", None) == ("salt",)
    assert plain_extra((7, "salt"), None, 7) == ("salt",)  # older releases: the adapter's int id
    assert plain_extra(("salt",), None, None) == ("salt",)
    assert plain_extra(("salt", "ad"), "ad", None) == ("salt", "ad")


def test_plain_chains_are_the_approximate_indexs_byte_keys() -> None:
    from policies.prefix import token_block_keys

    ids = tokens(10 * BS)
    seed = seed_for("m", None)
    assert chain_keys(pack_tokens(ids), BS, seed) == token_block_keys(ids, BS, seed)
    assert chain_keys(pack_tokens(ids), BS, seed, [None] * 10) == token_block_keys(ids, BS, seed)


@pytest.mark.parametrize("token_id", [0, 1, 2**31, 2**32 - 1])
def test_folding_leaves_32_bit_ids_alone(token_id: int) -> None:
    assert fold_token_id(token_id) == token_id


def test_the_simulators_ids_fold_as_the_sim_tokenizer_folds_them() -> None:
    text = "The simulator's token ids are wider than 32 bits, and both sides must agree. " * 8
    raw = sim_tokenizer.encode(text)  # what a simulated engine would publish
    assert max(raw) >= 2**32
    folded = SimTokenizer().encode_prompt(text)  # what the gateway's tokenizer gives a request
    assert pack_tokens(raw) == pack_tokens(folded)
    index = ExactIndex(1000)
    index.add_replica("r", "m", 1000)
    blocks = len(raw) // BS
    index.store("r", None, list(range(blocks)), raw[: blocks * BS], BS)
    assert index.match(request_keys(pack_tokens(folded), BS, "m", None), ("r",)) == {"r": blocks}


@pytest.mark.parametrize("blocks", [0, 1, 3, 4, 5, 12, 13, 100])
@pytest.mark.parametrize("salt", [None, "s"])
def test_lazy_keys_are_the_same_keys(blocks: int, salt: str | None) -> None:
    packed = pack_tokens(tokens(blocks * BS + 1))
    assert tuple(lazy_request_keys(packed, BS, "m", "ad", salt)) == request_keys(packed, BS, "m", "ad", salt)


def test_a_match_that_stops_early_hashes_no_further() -> None:
    ids = tokens(2 * BS)
    index = held(ids)
    consumed = []

    def keys() -> Iterator[int]:
        for k in lazy_request_keys(pack_tokens([*ids, *tokens(50 * BS, start=900)]), BS, "m", None):
            consumed.append(k)
            yield k

    assert index.match(keys(), ("r",)) == {"r": 2}
    assert len(consumed) == 3  # the two held and the first one nobody holds
