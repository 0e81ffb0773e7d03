"""gateway/routing.py with replicas in exact mode: the exact index's figures and this gateway's own
routing memory (the approximate index) together, over a hand-built exact index and FleetSnapshot."""

from __future__ import annotations

import random
import struct
from collections.abc import Iterable

from gateway.config import parse_config
from gateway.routing import Router
from policies.exact_index import ExactIndex
from policies.types import FleetSnapshot, RequestInfo
from tests.policies.scheduling.builders import NOW, replica

BLOCK = 4  # engine block = index block (tokens), so exact and approximate figures compare 1:1
SYSTEM = "You are a careful assistant for the accounts team; answer briefly. " * 4


class Exact:
    """What the Router asks of the KV-event side (`ExactSource`): every replica in exact mode."""

    def __init__(self) -> None:
        self.index = ExactIndex(default_capacity=10_000)
        for name in ("r0", "r1", "r2"):
            self.index.add_replica(name, "m", capacity=10_000)

    def exact_block_sizes(self, names: Iterable[str], now: float) -> dict[str, int]:
        return {n: BLOCK for n in names}

    def dispatched(self, replica: str) -> None:
        pass

    def holds(self, replica: str, token_ids: list[int], blocks: int) -> None:
        """The engine of `replica` stored the first `blocks` full blocks of `token_ids` (and no more:
        the rest evicted, or never computed there)."""
        hashes = [hash((replica, i)) for i in range(blocks)]
        self.index.store(replica, None, hashes, token_ids[: blocks * BLOCK], BLOCK)


def router() -> tuple[Router, Exact]:
    config = parse_config(
        {
            "replicas": [{"url": f"http://m{i}:1", "model": "m", "name": f"r{i}"} for i in range(3)],
            "models": [{"name": "m", "tokenizer": "sim"}],
            "scheduling": {"prefix_index": {"block_tokens": BLOCK}},
        }
    )
    r = Router(config, random.Random(0))
    exact = Exact()
    r.exact = exact
    return r, exact


def request(r: Router, question: str) -> tuple[RequestInfo, list[int]]:
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}
    facts = r.prompt_facts("chat", body, "m", None)
    ids = list(struct.unpack(f"<{len(facts.token_bytes) // 4}I", facts.token_bytes))
    info = RequestInfo(
        model="m", base_model="m", adapter=None, prompt_tokens=facts.prompt_tokens, max_tokens=16,
        prefix_keys=facts.prefix_keys, token_bytes=facts.token_bytes,
    )  # fmt: skip
    return info, ids


def snapshot() -> FleetSnapshot:
    return FleetSnapshot(tuple(replica(f"r{i}", pool="m", running=2, in_flight=2) for i in range(3)), NOW)


def shared_blocks(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n // BLOCK


def test_a_home_that_evicted_part_of_a_prefix_keeps_its_group() -> None:
    """r0 is the group's home (this gateway sent it the first request) but has since evicted the
    prefix's tail: its events say it holds 2 blocks. r1 holds a longer partial copy (half). On the exact
    index alone r1 would win and the group would move (then trade between two partial copies); with
    the routing memory r0 counts what was sent to it, and keeps the group."""
    r, exact = router()
    first, first_ids = request(r, "What is the balance?")
    r.dispatched(first, "r0")
    follow_up, ids = request(r, "And the overdraft limit on the second account?")
    prefix = shared_blocks(first_ids, ids)
    assert prefix >= 6
    exact.holds("r0", first_ids, 2)
    exact.holds("r1", first_ids, prefix // 2)
    routed = r.decide(follow_up, snapshot(), NOW)
    assert routed.match["r1"] == prefix // 2  # what r1's events say
    assert routed.match["r0"] >= prefix - 1  # at least the shared prefix sent there (index blocks)
    assert routed.decision.ranked[0].name == "r0"


def test_the_exact_index_still_shows_what_this_gateway_never_sent() -> None:
    """Another gateway placed the group on r2: this gateway's memory has nothing, the events do."""
    r, exact = router()
    _, first_ids = request(r, "What is the balance?")
    follow_up, ids = request(r, "And the overdraft limit on the second account?")
    prefix = shared_blocks(first_ids, ids)
    exact.holds("r2", first_ids, prefix)
    routed = r.decide(follow_up, snapshot(), NOW)
    assert routed.match["r2"] == prefix
    assert routed.decision.ranked[0].name == "r2"


def test_a_replica_the_events_say_holds_more_than_was_sent_counts_what_it_holds() -> None:
    """The larger of the two figures: r0 was sent a short prompt, and holds a longer one (sent by
    another gateway): its events win."""
    r, exact = router()
    short, _ = request(r, "Hi")
    r.dispatched(short, "r0")
    long_req, long_ids = request(r, "And the overdraft limit on the second account, and the fees?")
    exact.holds("r0", long_ids, len(long_ids) // BLOCK)
    routed = r.decide(long_req, snapshot(), NOW)
    assert routed.match["r0"] == len(long_req.prefix_keys)
