"""`multi-turn`: chat conversations whose history grows turn by turn.

Turn t of a conversation sends [system, user 1, assistant 1, ..., user t]: the previous turn's
messages, an assistant reply and a new user message. The runner does not feed back the replica's real
reply: the assistant message is deterministic filler of `output_tokens` tokens. The replica's cache
still holds the previous turn's whole prompt (it prefilled it), so turn t's prompt hits everything up
to the previous assistant message, which is what a gateway that keeps a conversation on one replica
wins; only the replica's own generated tokens are not reused.

Each conversation is one session (`session_id` = `conv-<c>`): its turns go one after another, and
conversations run concurrently. At most `active_conversations` are open at a time (all by default);
the next turn is drawn, seeded, from the open conversations, and a finished conversation makes room
for the next new one.

With `session_header` set, each request also carries its conversation's id in that HTTP header (the
gateway's `scheduling.session_header`, `x-session-id` by default), so the gateway's session map and
`session-affinity` scorer see it; without it (the default) the gateway routes on the prompt alone.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from loadtests.workloads.spec import RequestSpec, chat_body_from_messages, check_positive
from loadtests.workloads.text import WordText


class _Conversation:
    """A conversation's running history while `requests()` walks it; owned by one iterator."""

    __slots__ = ("index", "messages", "rng", "turn")

    def __init__(self, index: int, rng: random.Random, system: str) -> None:
        self.index = index
        self.rng = rng
        self.turn = 0
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}]


class MultiTurnWorkload:
    """`conversations` x `turns` chat requests; lengths in tokens. `request_id` is `mt-<c>-<turn>`
    (turn from 1), `group` and `session_id` are `conv-<c>`; with `session_header`, `conv-<c>` is also
    sent in that header."""

    name = "multi-turn"

    def __init__(
        self,
        *,
        conversations: int,
        turns: int,
        system_prompt_tokens: int,
        user_tokens: int,
        output_tokens: int,
        model: str,
        seed: int = 0,
        active_conversations: int | None = None,
        session_header: str | None = None,
    ) -> None:
        check_positive(
            conversations=conversations,
            turns=turns,
            system_prompt_tokens=system_prompt_tokens,
            user_tokens=user_tokens,
            output_tokens=output_tokens,
        )
        if active_conversations is not None:
            check_positive(active_conversations=active_conversations)
        self.conversations = conversations
        self.turns = turns
        self.system_prompt_tokens = system_prompt_tokens
        self.user_tokens = user_tokens
        self.output_tokens = output_tokens
        self.model = model
        self.seed = seed
        self.active_conversations = min(active_conversations or conversations, conversations)
        if session_header is not None and not session_header.strip():
            raise ValueError("session_header must be a header name or None, got an empty string")
        self.session_header = session_header.strip() if session_header else None
        self._text = WordText()

    def size(self) -> int:
        return self.conversations * self.turns

    def last_turn_prompt_tokens(self) -> int:
        """Content tokens of the last turn's prompt (chat template tokens not counted)."""
        replies = (self.turns - 1) * self.output_tokens
        return self.system_prompt_tokens + self.turns * self.user_tokens + replies

    def requests(self) -> Iterator[RequestSpec]:
        order_rng = random.Random(f"multi-turn:{self.seed}:order")
        started = 0
        open_: list[_Conversation] = []
        while open_ or started < self.conversations:
            while len(open_) < self.active_conversations and started < self.conversations:
                open_.append(self._start(started))
                started += 1
            pick = int(order_rng.random() * len(open_))
            conv = open_[pick]
            yield self._next_turn(conv)
            if conv.turn == self.turns:
                open_[pick] = open_[-1]
                open_.pop()

    def _start(self, index: int) -> _Conversation:
        rng = random.Random(f"multi-turn:{self.seed}:conv:{index}")
        return _Conversation(index, rng, self._text.text(rng, self.system_prompt_tokens))

    def _next_turn(self, conv: _Conversation) -> RequestSpec:
        if conv.turn > 0:
            reply = self._text.text(conv.rng, self.output_tokens)
            conv.messages.append({"role": "assistant", "content": reply})
        conv.messages.append({"role": "user", "content": self._text.text(conv.rng, self.user_tokens)})
        conv.turn += 1
        session = f"conv-{conv.index}"
        return RequestSpec(
            request_id=f"mt-{conv.index}-{conv.turn}",
            endpoint="chat",
            # A copy: later turns append to the history, and a spec must not change once yielded.
            body=chat_body_from_messages(self.model, list(conv.messages), self.output_tokens),
            session_id=session,
            group=session,
            headers={self.session_header: session} if self.session_header else {},
        )

    def describe(self) -> dict[str, Any]:
        return {
            "workload": self.name,
            "conversations": self.conversations,
            "turns": self.turns,
            "active_conversations": self.active_conversations,
            "requests": self.size(),
            "system_prompt_tokens": self.system_prompt_tokens,
            "user_tokens": self.user_tokens,
            "output_tokens": self.output_tokens,
            "last_turn_prompt_tokens": self.last_turn_prompt_tokens(),
            "model": self.model,
            "endpoint": "chat",
            "session_header": self.session_header,
            "seed": self.seed,
        }
