"""The exact index: what the events stored and did not remove, bounded by the engine, matched by the
longest held prefix, complete or not."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.exact_index import ExactIndex, Stored
from policies.exact_keys import pack_tokens, request_keys

BS = 2


def ids(*blocks: int) -> list[int]:
    """Token ids for blocks named by small ints: block n is [n, n]."""
    return [t for b in blocks for t in (b, b)]


def keys(*blocks: int, model: str = "m") -> tuple[int, ...]:
    return request_keys(pack_tokens(ids(*blocks)), BS, model, None)


def index(*replicas: str, capacity: int = 100) -> ExactIndex:
    out = ExactIndex(1000)
    for r in replicas:
        out.add_replica(r, "m", capacity)
    return out


def test_store_remove_and_the_longest_held_prefix() -> None:
    ix = index("a")
    assert ix.store("a", None, [10, 11, 12, 13], ids(1, 2, 3, 4), BS) is Stored.OK
    assert ix.blocks("a") == 4
    assert ix.match(keys(1, 2, 3, 4, 5), ("a",)) == {"a": 4}
    assert ix.remove("a", [12]) == 0  # the engine evicted block 3 alone: 4 is held, but not reachable
    assert ix.match(keys(1, 2, 3, 4), ("a",)) == {"a": 2}
    assert ix.remove("a", [12, 99]) == 2  # neither is held now
    assert ix.held_hashes("a") == {10, 11, 13}


def test_match_answers_for_every_candidate_at_once_and_only_for_candidates() -> None:
    ix = index("a", "b", "c")
    ix.store("a", None, [1, 2, 3], ids(1, 2, 3), BS)
    ix.store("b", None, [7, 8], ids(1, 2), BS)  # engines hash differently: kvgate's keys agree
    ix.store("c", None, [9], ids(5), BS)
    assert ix.match(keys(1, 2, 3), ("a", "b", "c")) == {"a": 3, "b": 2}
    assert ix.match(keys(1, 2, 3), ("b", "c")) == {"b": 2}
    assert ix.match(keys(1, 2, 3), ("zzz",)) == {}
    assert ix.match((), ("a",)) == {}


def test_a_block_stored_twice_stays_until_removed_twice() -> None:
    ix = index("a")
    ix.store("a", None, [10], ids(1), BS)
    ix.store("a", None, [10], ids(1), BS)  # a second physical copy of the same hash
    assert ix.blocks("a") == 2
    ix.remove("a", [10])
    assert ix.match(keys(1), ("a",)) == {"a": 1}
    ix.remove("a", [10])
    assert ix.match(keys(1), ("a",)) == {}
    assert ix.blocks("a") == 0


def test_a_parent_it_does_not_hold_makes_the_blocks_unkeyable_and_the_index_incomplete() -> None:
    ix = index("a", capacity=4)
    ix.reset("a", complete=True)
    assert ix.store("a", 555, [20, 21], ids(3, 4), BS) is Stored.UNKEYABLE
    assert ix.blocks("a") == 0
    assert not ix.complete("a")


def test_it_is_rebuilt_after_keying_a_whole_cache_with_no_unkeyable_store_between() -> None:
    ix = index("a", capacity=4)
    ix.store("a", None, [1, 2, 3], ids(1, 2, 3), BS)
    assert not ix.complete("a")  # a new replica's picture starts incomplete: 3 of 4 blocks keyed
    ix.store("a", 999, [4], ids(4), BS)  # unkeyable: the count starts again
    ix.remove("a", [1, 2, 3])
    ix.store("a", None, [5, 6, 7], ids(5, 6, 7), BS)
    assert not ix.complete("a")
    ix.store("a", 7, [8], ids(8), BS)
    assert ix.complete("a")


def test_holding_more_than_the_engine_can_means_missed_removals() -> None:
    ix = index("a", capacity=3)
    ix.reset("a", complete=True)
    ix.store("a", None, [1, 2, 3], ids(1, 2, 3), BS)
    assert ix.store("a", 3, [4], ids(4), BS) is Stored.OVERFLOW
    assert ix.blocks("a") == 0 and not ix.complete("a")
    ix.store("a", None, [1, 2, 3], ids(1, 2, 3), BS)
    ix.set_capacity("a", 2)  # the real capacity, once scraped, is smaller than what it holds
    assert ix.blocks("a") == 0 and ix.capacity("a") == 2


def test_a_new_block_size_is_a_new_engine() -> None:
    ix = index("a")
    ix.store("a", None, [1], ids(1), BS)
    assert ix.block_size("a") == BS
    assert ix.store("a", None, [2], [1, 1, 1, 1], 4) is Stored.BLOCK_SIZE
    assert ix.blocks("a") == 0 and ix.block_size("a") == 4


def test_reset_and_removal_of_a_replica_leave_the_others() -> None:
    ix = index("a", "b")
    ix.store("a", None, [1, 2], ids(1, 2), BS)
    ix.store("b", None, [3, 4], ids(1, 2), BS)
    ix.reset("a", complete=True)
    assert ix.complete("a") and ix.blocks("a") == 0
    assert ix.match(keys(1, 2), ("a", "b")) == {"b": 2}
    ix.remove_replica("b")
    ix.add_replica("c", "m", 10)  # reuses b's slot: must not inherit its blocks
    assert ix.match(keys(1, 2), ("a", "b", "c")) == {}
    assert ix.replicas() == ("a", "c")


def test_two_engine_hashes_naming_one_key_keep_it_until_both_go() -> None:
    ix = index("a")
    ix.store("a", None, [1], ids(1), BS)
    ix.store("a", None, [2], ids(1), BS)  # same tokens, another engine hash (a salt kvgate never saw)
    ix.remove("a", [1])
    assert ix.match(keys(1), ("a",)) == {"a": 1}
    ix.remove("a", [2])
    assert ix.match(keys(1), ("a",)) == {}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.just("store"), st.integers(0, 30), st.lists(st.integers(0, 3), min_size=1, max_size=4)
            ),
            st.tuples(st.just("remove"), st.integers(0, 40), st.just([])),
            st.tuples(st.just("clear"), st.just(0), st.just([])),
        ),
        max_size=60,
    )
)
def test_it_holds_exactly_what_was_stored_and_not_removed(ops: list[tuple[str, int, list[int]]]) -> None:
    """Against a reference: engine hash -> (parent, tokens) chains, with copies counted."""
    ix = index("a", capacity=10_000)
    copies: dict[int, int] = {}
    chain: dict[int, tuple[int, ...]] = {}  # engine hash -> the blocks from the root to it
    next_hash = 1000
    for op, arg, blocks in ops:
        if op == "store":
            parent = None if arg == 0 or not copies else sorted(copies)[arg % len(copies)]
            hashes = list(range(next_hash, next_hash + len(blocks)))
            next_hash += len(blocks)
            result = ix.store("a", parent, hashes, ids(*blocks), BS)
            assert result is Stored.OK
            root = () if parent is None else chain[parent]
            for n, h in enumerate(hashes):
                copies[h] = copies.get(h, 0) + 1
                chain[h] = root + tuple(blocks[: n + 1])
        elif op == "remove":
            h = sorted(copies)[arg % len(copies)] if copies else 0
            ix.remove("a", [h])
            if h in copies:
                copies[h] -= 1
                if not copies[h]:
                    del copies[h]
        else:
            ix.reset("a", complete=True)
            copies.clear()
    assert ix.held_hashes("a") == set(copies)
    assert ix.blocks("a") == sum(copies.values())
    held_chains = {chain[h] for h in copies}
    for h in copies:
        path = chain[h]
        want = 0
        while want < len(path) and path[: want + 1] in held_chains:
            want += 1
        assert ix.match(keys(*path), ("a",)).get("a", 0) == want
