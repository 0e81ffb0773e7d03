"""gateway/routing.py without a network: what `Router.prompt_facts` makes of a prompt (with and without
a tokenizer, one prompt or a completions batch), how `decide` uses the prefix index and the session map
over a hand-built FleetSnapshot, and switching profiles."""

from __future__ import annotations

import random
from typing import Any

import pytest

import gateway.routing
import gateway.tokenizers
from gateway.config import parse_config
from gateway.fleet.metrics_parse import ReplicaMetrics
from gateway.fleet.state import FleetChange, FleetState
from gateway.routing import PromptFacts, Router
from policies.prefix_index import capacity_blocks
from policies.types import FleetSnapshot, RequestInfo
from simulator import tokenizer as sim
from tests.gateway.stores.fakes import FakeClock
from tests.policies.scheduling.builders import NOW, replica

BLOCK_TOKENS = 4  # small index blocks: short prompts get several keys (16 bytes a block without a tokenizer)
SESSIONS_ONLY = {
    "filters": [],
    "scorers": [{"type": "session-affinity", "weight": 1.0}],
    "picker": {"type": "max-score"},
}


def router(tokenizer: str = "none", **scheduling: Any) -> Router:
    config = parse_config(
        {
            "replicas": [
                *({"url": f"http://m{i}:1", "model": "m", "name": f"r{i}"} for i in range(3)),
                {"url": "http://o:1", "model": "other", "name": "o0"},
            ],
            "models": [{"name": "m", "tokenizer": tokenizer}],
            "scheduling": {
                "prefix_index": {"block_tokens": BLOCK_TOKENS},
                "profiles": {"sessions-only": SESSIONS_ONLY},
                **scheduling,
            },
        }
    )
    return Router(config, random.Random(1))


def chat(*texts: str) -> dict[str, Any]:
    roles = ["system", "user", "assistant"]
    return {"messages": [{"role": roles[i % 3], "content": t} for i, t in enumerate(texts)]}


SYSTEM = "You are a careful assistant for the accounts team; answer briefly. " * 4  # 272 bytes
QUESTION = chat(SYSTEM, "What is the balance?")


def shared_blocks(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# --- prompt_facts ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "body", "tokens", "keyed_tokens"),
    [
        # no tokenizer: ~4 bytes per token of the canonical prompt, rounded up; blocks of 16 bytes
        ("completions", {"prompt": "x" * 70}, 18, 18),
        # a batch counts every prompt (18 + 100) and is keyed by its first
        ("completions", {"prompt": ["x" * 70, "y" * 400]}, 118, 18),
        ("completions", {"prompt": list(range(10))}, 10, 10),  # token ids: 4 bytes each, one token each
        ("completions", {"prompt": [list(range(10)), list(range(99))]}, 109, 10),
    ],
)
def test_prompt_facts_without_a_tokenizer_estimates_and_cuts_byte_blocks(
    endpoint: str, body: dict[str, Any], tokens: int, keyed_tokens: int
) -> None:
    facts = router().prompt_facts(endpoint, body, "m", None)
    assert facts.prompt_tokens == tokens and not facts.exact
    assert len(facts.prefix_keys) == keyed_tokens * 4 // (BLOCK_TOKENS * 4)  # full blocks only


def test_prompt_facts_for_chat_without_a_tokenizer() -> None:
    r = router()
    short = r.prompt_facts("chat", chat("hi"), "m", None)
    assert short == PromptFacts(short.prompt_tokens, False, ())  # under one block: no keys
    facts = r.prompt_facts("chat", chat(SYSTEM, "What is the balance?"), "m", None)
    assert not facts.exact and facts.prompt_tokens >= (len(SYSTEM) + len("What is the balance?")) // 4
    assert len(facts.prefix_keys) == facts.prompt_tokens // BLOCK_TOKENS


@pytest.mark.parametrize(
    ("endpoint", "body", "ids"),
    [
        ("chat", QUESTION, sim.encode(sim.render_chat(QUESTION["messages"]))),  # the chat template too
        ("completions", {"prompt": SYSTEM}, sim.encode(SYSTEM)),
        # a batch: every prompt counts, the first one is keyed
        ("completions", {"prompt": [SYSTEM, "another"]}, sim.encode(SYSTEM) + sim.encode("another")),
        ("completions", {"prompt": sim.encode(SYSTEM)}, sim.encode(SYSTEM)),  # ids past 32 bits, folded
    ],
)
def test_prompt_facts_with_the_sim_tokenizer_count_exactly_what_the_replica_will(
    endpoint: str, body: dict[str, Any], ids: list[int]
) -> None:
    facts = router("sim").prompt_facts(endpoint, body, "m", None)
    assert facts.exact and facts.prompt_tokens == len(ids)
    first = sim.encode(SYSTEM) if endpoint == "completions" else ids
    assert len(facts.prefix_keys) == len(first) // BLOCK_TOKENS


@pytest.mark.parametrize("tokenizer", ["none", "sim"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_keys_are_stable_for_a_shared_prefix_and_diverge_after_it(tokenizer: str, endpoint: str) -> None:
    r = router(tokenizer)

    def keys(question: str) -> tuple[int, ...]:
        body = chat(SYSTEM, question) if endpoint == "chat" else {"prompt": SYSTEM + question}
        return r.prompt_facts(endpoint, body, "m", None).prefix_keys

    a1 = keys("What is the balance of account 7 at the end of March?")
    a2 = keys("What is the balance of account 7 at the end of March?")
    b = keys("Who approved the transfer to the supplier last week?")
    assert a1 == a2  # the same prompt, the same keys, every time
    n = shared_blocks(a1, b)
    assert n >= len(SYSTEM) // 4 // BLOCK_TOKENS - 2  # the shared system prompt's blocks are shared
    assert n < min(len(a1), len(b))  # ... and once the questions differ, every later key differs
    assert not set(a1[n:]) & set(b[n:])


@pytest.mark.parametrize("tokenizer", ["none", "sim"])
def test_model_and_adapter_seed_the_keys(tokenizer: str) -> None:
    r = router(tokenizer)
    body = chat(SYSTEM, "same prompt")
    keys = {
        (base, adapter): r.prompt_facts("chat", body, base, adapter).prefix_keys
        for base, adapter in [("m", None), ("m", "sql-lora"), ("m", "chat-lora"), ("other", None)]
    }
    assert all(keys.values())
    seen: set[int] = set()
    for k in keys.values():  # not even the first block is shared: the engine keys its cache the same way
        assert not seen & set(k)
        seen |= set(k)
    assert r.prompt_facts("chat", body, "m", "sql-lora").prefix_keys == keys[("m", "sql-lora")]


def test_token_ids_beyond_32_bits_are_hashed_as_json_without_a_tokenizer() -> None:
    r = router()
    big = [2**40 + i for i in range(40)]
    facts = r.prompt_facts("completions", {"prompt": big}, "m", None)  # does not raise
    assert facts.prefix_keys and not facts.exact
    # a shared leading run of ids still shares leading keys, and a different one does not
    same_start = r.prompt_facts("completions", {"prompt": big[:30] + [7] * 10}, "m", None)
    other = r.prompt_facts("completions", {"prompt": [2**41 + i for i in range(40)]}, "m", None)
    assert 0 < shared_blocks(facts.prefix_keys, same_start.prefix_keys) < len(facts.prefix_keys)
    assert shared_blocks(facts.prefix_keys, other.prefix_keys) == 0
    # in a batch, too
    batch = r.prompt_facts("completions", {"prompt": [big, [1, 2, 3]]}, "m", None)
    assert batch.prefix_keys


@pytest.mark.parametrize(
    "prompt",
    [
        [2**40 + i for i in range(40)],
        [[2**40 + i for i in range(37)], [1, 2, 3]],  # a batch: every prompt's ids, as for small ids
        sim.encode(SYSTEM)[:40],  # the simulator's own ids reach 2**51
    ],
)
def test_token_ids_beyond_32_bits_count_one_token_each(prompt: list[Any]) -> None:
    """The reservation, the fair queue's cost and "request too large" all use this count: a prompt of
    40 token ids is 40 tokens whatever the ids' size (ids below 2**32 count so), not the length of
    their JSON text / 4."""
    facts = router().prompt_facts("completions", {"prompt": prompt}, "m", None)
    assert facts.prompt_tokens == 40


# --- decide --------------------------------------------------------------------------------------


def snapshot(**per_replica: dict[str, Any]) -> FleetSnapshot:
    """Replicas r0..r2 of pool "m" and o0 of pool "other", fresh and equally loaded unless told."""
    names = [("r0", "m"), ("r1", "m"), ("r2", "m"), ("o0", "other")]
    return FleetSnapshot(
        tuple(
            replica(n, **{"pool": p, "running": 2, "in_flight": 2, **per_replica.get(n, {})})
            for n, p in names
        ),
        NOW,
    )


def info(facts: PromptFacts, session: str | None = None, base: str = "m") -> RequestInfo:
    return RequestInfo(
        model=base,
        base_model=base,
        adapter=None,
        prompt_tokens=facts.prompt_tokens,
        max_tokens=16,
        session_id=session,
        prefix_keys=facts.prefix_keys,
    )


@pytest.mark.parametrize("holder", ["r0", "r1", "r2"])
def test_decide_prefers_the_replica_the_index_says_holds_the_prefix(holder: str) -> None:
    r = router()
    first = info(r.prompt_facts("chat", chat(SYSTEM, "first question?"), "m", None))
    r.dispatched(first, holder)
    follow_up = info(r.prompt_facts("chat", chat(SYSTEM, "a second, different question?"), "m", None))
    routed = r.decide(follow_up, snapshot(), NOW)
    assert routed.decision.ranked[0].name == holder
    held = routed.match[holder]
    assert 0 < held < len(follow_up.prefix_keys)  # the system prompt's blocks, not the question's
    assert {n for n, blocks in routed.match.items() if blocks} == {holder}
    assert {x.pool for x in routed.decision.ranked} == {"m"}  # only the request's pool is considered


def test_decide_without_prefix_keys_asks_the_index_nothing() -> None:
    r = router()
    routed = r.decide(info(PromptFacts(3, False, ())), snapshot(), NOW)
    assert routed.match == {} and len(routed.decision.ranked) == 3


def test_decide_lets_load_win_over_a_prefix_on_an_overloaded_replica() -> None:
    r = router()
    first = info(r.prompt_facts("chat", chat(SYSTEM, "q1"), "m", None))
    r.dispatched(first, "r1")
    busy = {"r1": {"running": 40, "waiting": 30, "in_flight": 70}}  # far past the default load guard
    routed = r.decide(info(r.prompt_facts("chat", chat(SYSTEM, "q2"), "m", None)), snapshot(**busy), NOW)
    assert routed.match.get("r1", 0) > 0 and routed.decision.ranked[0].name != "r1"


def test_decide_on_another_pool_sees_only_its_replicas() -> None:
    r = router()
    routed = r.decide(info(r.prompt_facts("chat", chat(SYSTEM, "q"), "other", None), base="other"),
                      snapshot(), NOW)  # fmt: skip
    assert [x.name for x in routed.decision.ranked] == ["o0"]


def test_session_map_records_the_replica_of_a_sessions_last_request() -> None:
    r = router()
    r.use_profile("sessions-only")
    facts = PromptFacts(3, False, ())
    r.dispatched(info(facts, session="conv-1"), "r2")
    r.dispatched(info(facts, session="conv-2"), "r0")
    r.dispatched(info(facts, session="conv-1"), "r1")  # the conversation moved: the latest counts
    for session, expected in [("conv-1", "r1"), ("conv-2", "r0")]:
        d = r.decide(info(facts, session=session), snapshot(), NOW).decision
        assert d.ranked[0].name == expected and d.total[expected] == 1.0


def test_session_map_is_bounded_and_forgets_the_least_recently_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway.routing, "SESSION_MAP_SIZE", 2)
    r = router()
    r.use_profile("sessions-only")
    facts = PromptFacts(3, False, ())

    def remembered(session: str) -> bool:
        d = r.decide(info(facts, session=session), snapshot(), NOW).decision
        return max(d.total.values()) == 1.0

    r.dispatched(info(facts, session="s1"), "r0")
    r.dispatched(info(facts, session="s2"), "r1")
    r.dispatched(info(facts, session="s1"), "r0")  # s1 used again: s2 is now the oldest
    r.dispatched(info(facts, session="s3"), "r2")
    assert [remembered(s) for s in ("s1", "s2", "s3")] == [True, False, True]
    assert len(r._sessions) == 2


# --- profiles ------------------------------------------------------------------------------------


def test_use_profile_switches_how_decisions_are_made() -> None:
    r = router()
    assert r.profile_name == "default"
    held = info(r.prompt_facts("chat", chat(SYSTEM, "q"), "m", None))
    r.dispatched(held, "r1")
    r.use_profile("round-robin")
    assert r.profile_name == "round-robin"
    winners = [r.decide(held, snapshot(), NOW).decision.ranked[0].name for _ in range(3)]
    assert sorted(winners) == ["r0", "r1", "r2"]  # rotates, prefix or not
    r.use_profile("default")
    assert r.decide(held, snapshot(), NOW).decision.ranked[0].name == "r1"


def test_config_profiles_override_builtins_by_name() -> None:
    r = router(profile="default", profiles={"default": SESSIONS_ONLY})
    held = info(r.prompt_facts("chat", chat(SYSTEM, "q"), "m", None), session="c")
    r.dispatched(held, "r1")
    d = r.decide(held, snapshot(), NOW).decision
    assert [s.name for s, _ in r.profile.weighted_scorers] == ["session-affinity"]
    assert d.ranked[0].name == "r1" and d.total == {"r0": 0.0, "r1": 1.0, "r2": 0.0}


def test_an_unknown_profile_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="no profile named 'nope'"):
        router(profile="nope")
    r = router()
    with pytest.raises(ValueError, match="no profile named 'nope'"):
        r.use_profile("nope")
    assert r.profile_name == "default" and r.profile is r.profiles["default"]  # nothing changed

MODEL = "m"


@pytest.mark.parametrize("tokenizer", ["none", "sim"])
@pytest.mark.parametrize(
    "batch",
    [
        ["The first prompt of a batch. " * 20, "a second, shorter one", "and a third " * 7],
        [[5, 6, 7] * 40, [1, 2], [9] * 33],
    ],
    ids=["text", "token-ids"],
)
def test_a_batch_counts_every_prompt_and_routes_on_the_first(tokenizer: str, batch: list[object]) -> None:
    r = router(tokenizer)
    facts = r.prompt_facts("completions", {"prompt": batch}, MODEL, None)
    each = [r.prompt_facts("completions", {"prompt": p}, MODEL, None) for p in batch]
    assert facts.prompt_tokens == sum(f.prompt_tokens for f in each)
    assert facts.prefix_keys == each[0].prefix_keys  # where the batch goes: its first prompt decides
    assert facts.exact is (tokenizer == "sim")


def test_exact_counts_with_the_sim_tokenizer() -> None:
    batch = ["one prompt", "another prompt, a little longer"]
    facts = router("sim").prompt_facts("completions", {"prompt": batch}, MODEL, None)
    tok = gateway.tokenizers.SimTokenizer()
    assert facts.prompt_tokens == sum(len(tok.encode_prompt(p)) for p in batch)


def test_a_scrape_sizes_the_replicas_index_and_feeds_the_group_ledger_its_counters() -> None:
    config = parse_config({"replicas": [{"url": "http://m0:1", "model": "m", "name": "r0"}],
                           "scheduling": {"profile": "kv-fit"}})  # fmt: skip
    r = Router(config, random.Random(1))
    fleet = FleetState(config.replicas, config.fleet, FakeClock())
    seen: list[FleetChange] = []
    fleet.add_listener(lambda name, change: (seen.append(change), r.observe_scrape(fleet, name, change)))
    before = r.index.capacity("r0")
    fleet.record_scrape("r0", ReplicaMetrics(running=0, waiting=0, kv_usage=0.0, block_size=16,
                                             num_gpu_blocks=512, prefix_queries_tokens=1000,
                                             prefix_hits_tokens=600))  # fmt: skip
    assert any(FleetChange.CAPACITY in c for c in seen)
    assert r.index.capacity("r0") == capacity_blocks(512, 16, r.index_block_tokens) != before
    assert r.groups._reality["r0"].last_hits == 600  # the ledger took the cumulative counters
