"""The simulator's tokenizer: exact round trips, ~4 characters per token, the chat template, filler."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.tokenizer import (
    FILLER_WORDS,
    MAX_TOKEN_BYTES,
    FillerText,
    decode,
    decode_token,
    encode,
    is_token,
    render_chat,
    token_bytes,
)

ENGLISH = (
    "The quick brown fox jumps over the lazy dog. In the beginning of the twentieth century, the city "
    "grew rapidly as new industries arrived and families moved from the countryside in search of work. "
    "Streets were paved, tramlines were laid, and the old market square was rebuilt with shops, banks "
    "and a grand theatre. Historians still argue about whether this growth made life better for most "
    "people, or whether it simply moved poverty from the fields to crowded apartment blocks near the "
    "factories. What is clear is that the pace of change was unlike anything seen before, and that it "
    "shaped the politics of the region for decades to come."
)


@given(st.text())
def test_round_trip_any_text(text: str) -> None:
    assert decode(encode(text)) == text


@given(st.text(alphabet=st.characters(codec="utf-8", categories=None)))
def test_round_trip_any_code_point(text: str) -> None:
    assert decode(encode(text)) == text


@pytest.mark.parametrize(
    "text", ["", " ", "\n\n", "\ud800", "a\udfffb", "日本語のテキスト", "👩‍👩‍👧 emoji", "\x00\x01"]
)
def test_round_trip_edge_cases(text: str) -> None:
    assert decode(encode(text)) == text


def test_empty_text_has_no_tokens() -> None:
    assert encode("") == []
    assert decode([]) == ""


def test_about_four_characters_per_token_on_english() -> None:
    assert 3.5 <= len(ENGLISH) / len(encode(ENGLISH)) <= 4.5


def test_tokens_are_word_pieces_with_their_leading_space() -> None:
    pieces = [decode_token(t) for t in encode("Hello, world!  It works.")]
    assert pieces == ["Hello", ",", " world", "!", " ", " It", " works", "."]


def test_long_words_are_cut_into_chunks() -> None:
    pieces = [decode_token(t) for t in encode(" internationalization")]
    assert "".join(pieces) == " internationalization"
    assert all(1 <= len(p.encode()) <= MAX_TOKEN_BYTES for p in pieces)


def test_same_prefix_same_tokens() -> None:
    a = encode("You are a helpful assistant. Answer briefly. What is 2+2?")
    b = encode("You are a helpful assistant. Answer briefly. Name a colour.")
    common = encode("You are a helpful assistant. Answer briefly.")
    assert a[: len(common)] == common == b[: len(common)]


def test_ids_are_below_2_to_the_51() -> None:
    ids = encode("ÿÿÿÿÿÿ" + "\U0010ffff" * 3 + ENGLISH)
    assert max(ids) < 2**51
    assert min(ids) > 0


def test_cut_character_decodes_to_replacement() -> None:
    assert len(encode("漢字")) == 1, "two 3-byte characters fit one 6-byte token"
    ids = encode(" 漢字")  # space + 6 bytes = 7 bytes: the second character is cut
    assert len(ids) == 2
    assert "\ufffd" in decode_token(ids[0])


@pytest.mark.parametrize("bad", [0, 1, 2**48 - 1, 7 * 2**48, (1 << 48) + 256, -5])
def test_out_of_vocabulary_ids_are_rejected(bad: int) -> None:
    assert not is_token(bad)
    with pytest.raises(ValueError, match="vocabulary"):
        token_bytes(bad)
    with pytest.raises(ValueError, match=str(bad)):
        decode([*encode("fine so far"), bad, 0])


def test_chat_template() -> None:
    text = render_chat(
        [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Hi"},
                    {"type": "image_url"},
                    {"type": "text", "text": "there"},
                ],
            },
            {"role": "assistant", "content": None},
        ]
    )
    assert text == "<|system|>\nBe brief.\n<|user|>\nHi\nthere\n<|assistant|>\n\n<|assistant|>\n"


def test_chat_prefix_is_token_prefix() -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 20}
    one = encode(render_chat([system, {"role": "user", "content": "first question"}]))
    two = encode(render_chat([system, {"role": "user", "content": "another question"}]))
    # Like any tokenizer's, the last token of a text may merge with what follows it: drop it.
    shared = encode(render_chat([system])[: -len("<|assistant|>\n")])[:-1]
    assert len(shared) > 100
    assert one[: len(shared)] == shared == two[: len(shared)]


@pytest.mark.parametrize(
    "messages",
    [
        [{"content": "no role"}],
        [{"role": 3, "content": "x"}],
        [{"role": "user", "content": 42}],
        [{"role": "user", "content": ["not a part"]}],
        [{"role": "user", "content": [{"type": "text", "text": 5}]}],
    ],
)
def test_chat_template_rejects_bad_messages(messages: list[dict[str, object]]) -> None:
    with pytest.raises(ValueError):
        render_chat(messages)


def test_filler_tokens_are_single_words() -> None:
    filler = FillerText()
    for i in range(len(FILLER_WORDS) + 3):
        token = filler.token(seed=7, index=i)
        assert decode_token(token) == filler.text(7, i)
        assert decode_token(token).strip() in FILLER_WORDS


def test_filler_is_deterministic_and_seeded() -> None:
    filler = FillerText()
    assert filler.token_ids(20, seed=1) == filler.token_ids(20, seed=1)
    assert filler.token_ids(20, seed=1) != filler.token_ids(20, seed=2)
    assert filler.token_ids(5, seed=3, start=10) == filler.token_ids(15, seed=3)[10:]
    text = decode(filler.token_ids(12, seed=0))
    assert text.startswith(" the of and to")


def test_filler_rejects_multi_token_words() -> None:
    with pytest.raises(ValueError):
        FillerText(("internationalization",))
    with pytest.raises(ValueError):
        FillerText(())
