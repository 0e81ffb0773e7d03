from __future__ import annotations

from collections import defaultdict

import pytest

from loadtests.workloads.multi_turn import MultiTurnWorkload
from loadtests.workloads.spec import RequestSpec
from tests.loadtests.workloads.tokens import count_tokens


def workload(seed: int = 0, active: int | None = None, conversations: int = 4) -> MultiTurnWorkload:
    return MultiTurnWorkload(
        conversations=conversations, turns=5, system_prompt_tokens=40, user_tokens=12, output_tokens=20,
        model="tiny-llama", seed=seed, active_conversations=active,
    )  # fmt: skip


def by_conversation(specs: list[RequestSpec]) -> dict[str, list[RequestSpec]]:
    out: dict[str, list[RequestSpec]] = defaultdict(list)
    for s in specs:
        out[s.session_id or ""].append(s)
    return out


def test_sizes_and_sessions() -> None:
    specs = list(workload().requests())
    assert len(specs) == 20 == workload().size()
    convs = by_conversation(specs)
    assert sorted(convs) == [f"conv-{c}" for c in range(4)]
    for session, turns in convs.items():
        assert [s.request_id for s in turns] == [f"mt-{session[5:]}-{t}" for t in range(1, 6)]
        assert all(s.group == session and s.endpoint == "chat" for s in turns)


def test_history_grows_by_reply_and_user_message() -> None:
    for turns in by_conversation(list(workload().requests())).values():
        previous: list[dict[str, str]] | None = None
        for t, spec in enumerate(turns, start=1):
            messages = spec.body["messages"]
            assert len(messages) == 2 * t
            assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * (t - 1) + ["user"]
            if previous is not None:
                assert messages[: len(previous)] == previous  # the prior turn is a prefix
                assert count_tokens(messages[-2]["content"]) == 20  # reply filler of the output length
            assert count_tokens(messages[-1]["content"]) == 12
            previous = messages
        prompt = sum(count_tokens(m["content"]) for m in turns[-1].body["messages"])
        assert prompt == workload().last_turn_prompt_tokens() == 40 + 5 * 12 + 4 * 20


def test_specs_do_not_change_after_being_yielded() -> None:
    it = workload(active=1).requests()
    first = next(it)
    snapshot = list(first.body["messages"])
    rest = list(it)
    assert first.body["messages"] == snapshot and len(rest) == 19


def test_seeded() -> None:
    assert list(workload(seed=3).requests()) == list(workload(seed=3).requests())
    a, b = list(workload(seed=3).requests()), list(workload(seed=4).requests())
    assert [s.body for s in a] != [s.body for s in b]


def test_active_window_bounds_open_conversations() -> None:
    specs = list(workload(active=2, conversations=6).requests())
    open_: set[str] = set()
    done: dict[str, int] = defaultdict(int)
    widest = 0
    for s in specs:
        session = s.session_id or ""
        open_.add(session)
        done[session] += 1
        widest = max(widest, len(open_))
        if done[session] == 5:
            open_.discard(session)
    assert widest == 2 and len(done) == 6


def test_conversations_are_interleaved() -> None:
    sessions = [s.session_id for s in workload().requests()]
    assert sessions[:4] != [sessions[0]] * 4
    assert sessions.index("conv-3") < 15  # the last conversation does not wait for the others to end


@pytest.mark.parametrize("bad", [{"turns": 0}, {"user_tokens": 0}, {"active_conversations": 0}])
def test_rejects(bad: dict[str, int]) -> None:
    args = dict(conversations=2, turns=2, system_prompt_tokens=5, user_tokens=5, output_tokens=5)
    args.update(bad)
    with pytest.raises(ValueError):
        MultiTurnWorkload(**args, model="m")  # type: ignore[arg-type]


def test_the_session_header_carries_the_conversation_only_when_asked() -> None:
    assert all(s.headers == {} for s in workload().requests())
    with_header = MultiTurnWorkload(
        conversations=3, turns=2, system_prompt_tokens=40, user_tokens=12, output_tokens=20,
        model="tiny-llama", session_header="x-session-id",
    )  # fmt: skip
    specs = list(with_header.requests())
    assert all(s.headers == {"x-session-id": s.session_id} for s in specs)
    assert with_header.describe()["session_header"] == "x-session-id"
    assert workload().describe()["session_header"] is None
    with pytest.raises(ValueError, match="session_header"):
        MultiTurnWorkload(conversations=1, turns=1, system_prompt_tokens=1, user_tokens=1, output_tokens=1,
                          model="m", session_header=" ")  # fmt: skip
