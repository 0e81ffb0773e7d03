import gc
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.prefix import byte_block_keys
from policies.prefix_index import PrefixIndex, capacity_blocks

A, B, C = "a", "b", "c"


def chain(text: str) -> list[int]:
    """Chained keys with one block per character: "abc" and "abd" share their first two keys."""
    return list(byte_block_keys(text.encode(), 1, 0))


class ReferenceIndex:
    """The obvious implementation: one ordered list per replica, scanned in full."""

    def __init__(self, default_capacity: int) -> None:
        self.default_capacity = default_capacity
        self.lrus: dict[str, list[int]] = {}
        self.capacity: dict[str, int] = {}

    def _cap(self, replica: str) -> int:
        return self.capacity.get(replica, self.default_capacity)

    def set_capacity(self, replica: str, capacity: int) -> None:
        self.capacity[replica] = capacity
        lru = self.lrus.setdefault(replica, [])
        del lru[: max(0, len(lru) - capacity)]

    def record(self, replica: str, keys: Sequence[int]) -> None:
        lru = self.lrus.setdefault(replica, [])
        for key in reversed(list(keys)[: self._cap(replica)]):
            if key in lru:
                lru.remove(key)
            lru.append(key)
        del lru[: max(0, len(lru) - self._cap(replica))]

    def remove_replica(self, replica: str) -> None:
        self.lrus.pop(replica, None)
        self.capacity.pop(replica, None)

    def match(self, keys: Sequence[int], replicas: Sequence[str]) -> dict[str, int]:
        """Replicas holding at least the first key -> leading keys held (absent = 0)."""
        result = {}
        for r in replicas:
            held = set(self.lrus.get(r, ()))
            n = 0
            while n < len(keys) and keys[n] in held:
                n += 1
            if n:
                result[r] = n
        return result


@pytest.mark.parametrize(
    ("recorded", "query", "expected"),
    [
        ({A: "abc"}, "abcd", {A: 3}),
        ({A: "abc"}, "axc", {A: 1}),  # stops at the first miss: after "ax" the chain is another one
        ({A: "bc"}, "abc", {}),  # the same characters later in a prompt are different blocks
        ({A: "ab", B: "abcd"}, "abcd", {A: 2, B: 4}),
        ({A: "abc", B: "abc"}, "abc", {A: 3, B: 3}),
        ({A: "abcdefgh", B: "abcx", C: "abcdefgy"}, "abcdefgh", {A: 8, B: 3, C: 7}),
        ({A: "abc"}, "", {}),
        ({}, "a", {}),
    ],
)
def test_match_counts_leading_blocks(recorded: dict[str, str], query: str, expected: dict[str, int]) -> None:
    index = PrefixIndex(default_capacity=100)
    for replica, text in recorded.items():
        index.record(replica, chain(text))
    assert index.match(chain(query), [A, B, C]) == expected


def test_match_only_reports_the_asked_replicas() -> None:
    index = PrefixIndex(default_capacity=100)
    index.record(A, [1, 2])
    index.record(B, [1, 2])
    assert index.match([1, 2], [B, "unknown"]) == {B: 2}
    assert index.match([1, 2], []) == {}


def test_lru_evicts_least_recent_at_capacity() -> None:
    index = PrefixIndex(default_capacity=4)
    index.record(A, [1, 2, 3])
    index.record(A, [7, 8])  # 5 keys > 4: the oldest (the tail of the first prompt, 3) goes
    assert index.replica_sizes() == {A: 4}
    assert index.match([1, 2, 3], [A]) == {A: 2}
    assert index.match([7, 8], [A]) == {A: 2}


def test_record_refreshes_keys() -> None:
    index = PrefixIndex(default_capacity=4)
    index.record(A, [1, 2])
    index.record(A, [5, 6])
    index.record(A, [1, 2])  # refreshed: now 5, 6 are the oldest
    index.record(A, [9])
    assert index.match([1, 2], [A]) == {A: 2}
    assert index.match([5, 6], [A]) == {A: 1}  # 6, the oldest (a tail), was evicted; its head 5 stays
    assert index.match([6], [A]) == {}


def test_leading_blocks_outlive_tails() -> None:
    index = PrefixIndex(default_capacity=3)
    index.record(A, [1, 2, 3, 4])  # over capacity: only the first three are recorded
    assert index.match([1, 2, 3, 4], [A]) == {A: 3}
    index.record(A, [1, 9])  # 1 refreshed, 9 new: the tail key 3 is evicted first
    assert index.match([1, 2, 3], [A]) == {A: 2}


def test_set_capacity_shrinks_now_and_per_replica() -> None:
    index = PrefixIndex(default_capacity=10)
    index.record(A, list(range(10)))
    index.record(B, list(range(10)))
    index.set_capacity(A, 4)
    assert index.replica_sizes() == {A: 4, B: 10}
    assert index.match(list(range(10)), [A, B]) == {A: 4, B: 10}
    assert index.capacity(A) == 4 and index.capacity(B) == 10 and index.capacity("new") == 10
    index.set_capacity(C, 0)
    index.record(C, [0, 1])
    assert index.match([0], [C]) == {}


def test_remove_replica_forgets_its_keys_and_reuses_its_slot() -> None:
    index = PrefixIndex(default_capacity=10)
    index.record(A, [1, 2])
    index.record(B, [1, 3])
    index.remove_replica(A)
    index.remove_replica("never-seen")
    assert index.match([1, 2], [A, B]) == {B: 1}
    assert index.size() == 2  # keys 1 and 3, held by b
    index.record(C, [5])  # takes a's old slot: must not inherit a's keys
    assert index.match([1, 2], [C]) == {}
    assert index.match([5], [B, C]) == {C: 1}


def test_clear_and_sizes() -> None:
    index = PrefixIndex(default_capacity=10)
    index.record(A, [1, 2, 3])
    index.record(B, [1, 2])
    assert index.size() == 3
    assert index.entries() == 5
    assert index.replica_sizes() == {A: 3, B: 2}
    assert index.estimated_bytes() > 0
    index.clear()
    assert index.size() == 0 and index.entries() == 0
    assert index.match([1], [A, B]) == {}
    index.record(A, [1])
    assert index.match([1], [A, B]) == {A: 1}


def test_memory_stays_bounded_under_endless_distinct_prompts() -> None:
    index = PrefixIndex(default_capacity=200)
    replicas = [f"r{i}" for i in range(4)]
    sizes = []
    for n in range(10_000):
        keys = [n * 1000 + j for j in range(16)]  # every prompt distinct
        index.record(replicas[n % 4], keys)
        if n % 1000 == 999:
            sizes.append(index.estimated_bytes())
            assert index.entries() == index.size() == 4 * 200
    assert max(sizes) <= 1.5 * min(sizes)  # the LRU's generations make it breathe, not grow


def heavy_traversals(root: object) -> list[str]:
    """Types of objects reachable from `root` (not through classes) that the garbage collector
    tracks and whose traversal visits more than 1,000 references."""
    seen: set[int] = set()
    stack = [root]
    found = []
    while stack:
        obj = stack.pop()
        if id(obj) in seen or not gc.is_tracked(obj) or isinstance(obj, type):
            continue
        seen.add(id(obj))
        referents = gc.get_referents(obj)
        if len(referents) > 1000:
            found.append(type(obj).__name__)
        stack.extend(referents)
    return found


def test_keys_live_in_containers_the_garbage_collector_skips() -> None:
    # A full collection traverses every entry of every tracked container: an OrderedDict LRU of a
    # million keys would pause the event loop ~100 ms. Dicts of ints and arrays are not tracked.
    index = PrefixIndex(default_capacity=50_000)
    for n in range(200):
        index.record(A, [n * 1000 + j for j in range(100)])
        index.record(B, [n * 1000 + j for j in range(50)])
    assert index.entries() == 30_000
    assert heavy_traversals(index) == []


def test_capacity_blocks_from_the_engine() -> None:
    assert capacity_blocks(25_000, 16, 64) == 6_250
    assert capacity_blocks(25_000, 16, 16) == 25_000
    assert capacity_blocks(0, 16, 64) == 0
    with pytest.raises(ValueError, match="index_block_tokens"):
        capacity_blocks(1, 16, 0)


@pytest.mark.parametrize("capacity", [0, -1])
def test_default_capacity_must_be_positive(capacity: int) -> None:
    with pytest.raises(ValueError, match="default_capacity"):
        PrefixIndex(default_capacity=capacity)


def test_set_capacity_refuses_negative() -> None:
    with pytest.raises(ValueError, match="capacity_blocks"):
        PrefixIndex(default_capacity=1).set_capacity(A, -1)


REPLICAS = [f"r{i}" for i in range(70)]  # more than 64 slots: masks wider than one machine word
# Prompts over a two-letter alphabet, one block per character: they share prefixes often.
PROMPTS = st.text(alphabet="ab", max_size=12)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.sampled_from(REPLICAS[:6] + REPLICAS[-3:]), PROMPTS),
        st.tuples(st.just("capacity"), st.sampled_from(REPLICAS[:6]), st.integers(0, 8)),
        st.tuples(st.just("remove"), st.sampled_from(REPLICAS[:6] + REPLICAS[-3:]), st.just("")),
        st.tuples(st.just("clear"), st.just(""), st.just("")),
        st.tuples(st.just("match"), st.just(""), PROMPTS),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(ops=OPS, filler=st.one_of(st.integers(0, 3), st.integers(56, 64)), data=st.data())
def test_agrees_with_the_reference(
    ops: list[tuple[str, str, object]], filler: int, data: st.DataObject
) -> None:
    index = PrefixIndex(default_capacity=6)
    reference = ReferenceIndex(default_capacity=6)
    recorded: list[str] = []
    for name in REPLICAS[6 : 6 + filler]:  # occupy slots so the tested replicas get high bits too
        index.record(name, chain("b"))
        reference.record(name, chain("b"))
    for op, replica, arg in ops:
        if op == "record":
            assert isinstance(arg, str)
            index.record(replica, chain(arg))
            reference.record(replica, chain(arg))
            recorded.append(arg)
        elif op == "capacity":
            assert isinstance(arg, int)
            index.set_capacity(replica, arg)
            reference.set_capacity(replica, arg)
        elif op == "remove":
            index.remove_replica(replica)
            reference.remove_replica(replica)
        elif op == "clear":
            index.clear()
            for keys in reference.lrus.values():
                keys.clear()
        else:
            assert isinstance(arg, str)
            if recorded and data.draw(st.booleans()):  # mostly ask about prompts that were recorded
                arg = data.draw(st.sampled_from(recorded)) + arg[:3]
            keys = chain(arg)
            assert index.match(keys, REPLICAS) == reference.match(keys, REPLICAS)
    sizes = {r: len(keys) for r, keys in reference.lrus.items()}
    assert index.replica_sizes() == sizes
    assert index.size() == len({k for keys in reference.lrus.values() for k in keys})


@settings(max_examples=200, deadline=None)
@given(
    records=st.lists(
        st.tuples(st.sampled_from(REPLICAS[:5]), st.lists(st.integers(0, 9), max_size=8)), max_size=20
    ),
    query=st.lists(st.integers(0, 9), max_size=10),
)
def test_arbitrary_keys_give_bounded_answers(records: list[tuple[str, list[int]]], query: list[int]) -> None:
    """Keys that are not chains break the prefix invariant: answers are approximate but sane."""
    index = PrefixIndex(default_capacity=5)
    for replica, keys in records:
        index.record(replica, keys)
    result = index.match(query, REPLICAS[:5])
    for replica, count in result.items():
        assert 1 <= count <= len(query)
        assert index.match(query[:1], [replica]) == {replica: 1}  # it holds the first key


def test_seventy_replicas_dropping_out_at_every_point() -> None:
    index = PrefixIndex(default_capacity=100)
    expected = {}
    for i, name in enumerate(REPLICAS):
        held = "abcdefgh"[: 1 + i % 8]
        index.record(name, chain(held + "xyz"[: i % 3]))  # some continue differently after their share
        expected[name] = len(held)
    assert index.match(chain("abcdefgh"), REPLICAS) == expected
    assert index.match(chain("abcdefgh"), REPLICAS[::-1]) == expected
    assert index.match(chain("abcdefgh"), REPLICAS[60:]) == {n: expected[n] for n in REPLICAS[60:]}
