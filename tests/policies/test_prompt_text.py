from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.prompt_text import canonical_chat_bytes, canonical_completion_bytes, pack_token_ids

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 20}


def common_prefix(a: bytes, b: bytes) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize(
    ("first", "second"),
    [
        # shared system prompt, different questions
        (
            [SYSTEM, {"role": "user", "content": "What is 2+2?"}],
            [SYSTEM, {"role": "user", "content": "Name a color."}],
        ),
        # a conversation and its next turn
        (
            [SYSTEM, {"role": "user", "content": "hi"}],
            [
                SYSTEM,
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "more"},
            ],
        ),
    ],
)
def test_shared_leading_messages_share_leading_bytes(first: list[Any], second: list[Any]) -> None:
    a, b = canonical_chat_bytes(first), canonical_chat_bytes(second)
    shared = canonical_chat_bytes(first[:1])
    assert a.startswith(shared) and b.startswith(shared)
    assert a != b


def test_the_next_turn_extends_the_previous_conversation() -> None:
    turn1 = [SYSTEM, {"role": "user", "content": "hi"}]
    turn2 = [*turn1, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert canonical_chat_bytes(turn2).startswith(canonical_chat_bytes(turn1))


def test_a_shared_document_inside_one_message_shares_bytes() -> None:
    doc = "A long shared document. " * 100
    a = canonical_chat_bytes([{"role": "user", "content": doc + "Question one?"}])
    b = canonical_chat_bytes([{"role": "user", "content": doc + "Another question?"}])
    assert common_prefix(a, b) >= len(doc)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ([{"role": "user", "content": "x"}], [{"role": "assistant", "content": "x"}]),
        (
            [{"role": "user", "content": "ab"}],
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
        ),
        ([{"role": "user", "content": "a\x00Rb"}], [{"role": "user", "content": "a"}, {"role": "b"}]),
        ([{"role": "user", "content": "\x01\x02"}], [{"role": "user", "content": "\x00"}]),
        ([{"role": "user", "content": "x", "name": "n"}], [{"role": "user", "content": "x"}]),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://a/1.png"}}]}],
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://a/2.png"}}]}],
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
            [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "u"}}]}],
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
                }
            ],
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"function": {"name": "g", "arguments": "{}"}}],
                }
            ],
        ),
        (
            [{"role": "tool", "content": "1", "tool_call_id": "a"}],
            [{"role": "tool", "content": "1", "tool_call_id": "b"}],
        ),
    ],
)
def test_different_prompts_differ(first: list[Any], second: list[Any]) -> None:
    assert canonical_chat_bytes(first) != canonical_chat_bytes(second)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (
            [{"role": "user", "content": "hi"}],
            [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://a/1.png"}}]}],
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://a/1.png"}}]}],
        ),
        (
            [{"role": "user", "content": "x"}],
            [{"role": "user", "content": "x", "extra": 1}],
        ),  # unknown fields ignored
    ],
)
def test_equivalent_prompts_encode_the_same(first: list[Any], second: list[Any]) -> None:
    assert canonical_chat_bytes(first) == canonical_chat_bytes(second)


def test_content_parts_keep_their_order_and_text() -> None:
    parts = [
        {"type": "text", "text": "look at"},
        {"type": "image_url", "image_url": {"url": "http://a/1.png"}},
        {"type": "text", "text": "and say"},
    ]
    data = canonical_chat_bytes([{"role": "user", "content": parts}])
    assert data.index(b"look at") < data.index(b"image_url") < data.index(b"and say")


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [None, 3, "x"],
        [{"role": 5, "content": 7}],
        [{"content": [None, {"type": 1}, {"type": "image_url", "image_url": 3}, {"no": "type"}]}],
        [{"role": "user", "content": "\ud800 lone surrogate"}],
        [{"role": "assistant", "tool_calls": [1, {"function": None}, {"function": {"name": None}}]}],
    ],
)
def test_never_raises_on_odd_shapes(messages: list[Any]) -> None:
    assert isinstance(canonical_chat_bytes(messages), bytes)


def test_utf8() -> None:
    assert "héllo".encode() in canonical_chat_bytes([{"role": "user", "content": "héllo"}])


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("hello", b"hello"),
        (["hello", "other"], b"hello"),  # a batch is canonicalized as its first prompt
        ([1, 2], b"\x01\x00\x00\x00\x02\x00\x00\x00"),
        ([[1, 2], [3]], b"\x01\x00\x00\x00\x02\x00\x00\x00"),
        ([], b""),
        ("", b""),
    ],
)
def test_completion_bytes(prompt: Any, expected: bytes) -> None:
    assert canonical_completion_bytes(prompt) == expected


@pytest.mark.parametrize("ids", [[-1], [2**32], [1.5]])
def test_token_ids_out_of_range_are_refused(ids: list[Any]) -> None:
    with pytest.raises(ValueError, match="token ids"):
        pack_token_ids(ids)


def test_pack_token_ids_accepts_any_sequence() -> None:
    assert pack_token_ids((7, 2**32 - 1)) == b"\x07\x00\x00\x00\xff\xff\xff\xff"


def test_pinned_chat_bytes() -> None:
    """Literal bytes of the encoding in force when written: a faster path must produce the same."""
    messages: list[Any] = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "name": "ann",
            "content": [
                {"type": "text", "text": "hi\x00"},
                {"type": "image_url", "image_url": {"url": "http://x/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        7,
    ]
    assert canonical_chat_bytes(messages) == (
        b"\x00Rsystem\x00TBe brief.\x00Ruser\x00Nann\x00Thi\x01\x02\x00Ximage_url\x00H649722555b46ad4e"
        b"\x00Rassistant\x00Ff\x00A{}\x00Rtool\x00T42\x00Ic1\x00?int"
    )


class _NotPlainDict(dict[str, Any]):
    """A mapping that is not exactly a dict: takes the general path, field by field."""


_text = st.text(alphabet=st.sampled_from(["a", "é", " ", "\x00", "\x01", "\ud800", "R", "T"]), max_size=6)
_field = st.one_of(st.none(), _text, st.integers(0, 3), st.lists(st.fixed_dictionaries({"type": _text})))
_message = st.one_of(
    st.fixed_dictionaries({"role": _text, "content": _text}),  # the fast path's shape
    st.dictionaries(st.sampled_from(["role", "content", "name", "tool_call_id", "x"]), _field, max_size=3),
    st.integers(),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_message, max_size=6))
def test_the_common_shape_fast_path_encodes_as_the_general_path(messages: list[Any]) -> None:
    general = [_NotPlainDict(m) if type(m) is dict else m for m in messages]
    assert canonical_chat_bytes(messages) == canonical_chat_bytes(general)
