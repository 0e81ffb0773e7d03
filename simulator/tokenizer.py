"""The simulator's own deterministic tokenizer, chat template and filler output.

Tokenizing: the text's UTF-8 bytes are cut into pieces the way GPT-style pre-tokenizers do — an
optional leading space plus a run of word bytes (ASCII letters and digits, and every non-ASCII byte),
an optional leading space plus a run of punctuation, or a run of whitespace (a run followed by a word
leaves its last space to that word) — and every piece longer than `MAX_TOKEN_BYTES` (6) bytes is cut
into chunks of at most 6 bytes. Each chunk is one token. English text comes out at about 4 characters
per token (most words with their leading space are one token, long words two).

Token ids are the chunk itself, reversibly: `id = len(chunk) * 2**48 + int.from_bytes(chunk, "big")`,
so every id is below 7 * 2**48 < 2**51 (exact in JSON doubles and int64). Decoding joins the chunks'
bytes; `decode(encode(s)) == s` for every str, lone surrogates included. A single token may end inside
a multi-byte character; `decode_token` then shows U+FFFD for the cut part.

There is no vocabulary file and no state: everything here is pure and safe to call from any thread.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence

MAX_TOKEN_BYTES = 6
_LEN_SHIFT = 8 * MAX_TOKEN_BYTES
_VALUE_MASK = (1 << _LEN_SHIFT) - 1
_LEN_TERMS = tuple(n << _LEN_SHIFT for n in range(MAX_TOKEN_BYTES + 1))

_WORD = rb"[A-Za-z0-9\x80-\xff]"
_PUNCT = rb"[^A-Za-z0-9\x80-\xff\s]"
_PIECE = re.compile(
    rb" " + _WORD + rb"{1,5}|" + _WORD + rb"{1,6}"
    rb"| " + _PUNCT + rb"{1,5}|" + _PUNCT + rb"{1,6}"
    rb"|\s{1,6}(?!\S)|\s{1,6}"
)
_FROM_BYTES = int.from_bytes


def encode(text: str) -> list[int]:
    """Token ids of `text` (see the module docstring); `[]` for the empty string."""
    chunks = _PIECE.findall(text.encode("utf-8", "surrogatepass"))
    # Every map runs in C (int.from_bytes is big-endian by default since 3.11); the regex is most of it.
    return list(map(operator.add, map(_FROM_BYTES, chunks), map(_LEN_TERMS.__getitem__, map(len, chunks))))


def is_token(token_id: int) -> bool:
    """Whether `token_id` is a token of this tokenizer (some chunk of 1 to 6 bytes)."""
    length = token_id >> _LEN_SHIFT
    return 1 <= length <= MAX_TOKEN_BYTES and not (token_id & _VALUE_MASK) >> (8 * length)


def token_bytes(token_id: int) -> bytes:
    """The bytes one token stands for; ValueError if `token_id` is no token of this tokenizer."""
    if not is_token(token_id):
        raise ValueError(f"token id {token_id} is out of vocabulary")
    return (token_id & _VALUE_MASK).to_bytes(token_id >> _LEN_SHIFT, "big")


def decode(ids: Sequence[int]) -> str:
    """The text of `ids`; exact inverse of `encode`. ValueError on an id that is no token."""
    # C-level maps as in `encode` (id >> 48 is the length, id & mask the bytes), twice as fast as
    # `token_bytes` per id; an id that is no token ends in a bad length or an OverflowError.
    lengths = list(map(_LEN_SHIFT.__rrshift__, ids))
    try:
        if lengths and (min(lengths) < 1 or max(lengths) > MAX_TOKEN_BYTES):
            raise OverflowError
        data = b"".join(map(int.to_bytes, map(_VALUE_MASK.__rand__, ids), lengths))
    except OverflowError:
        bad = next(i for i in ids if not is_token(i))
        raise ValueError(f"token id {bad} is out of vocabulary") from None
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        # Only ids that were not produced by encoding one whole string get here.
        return data.decode("utf-8", "replace")


def decode_token(token_id: int) -> str:
    """The text of one token (U+FFFD where it cuts a multi-byte character)."""
    return decode((token_id,))


def render_chat(messages: Sequence[Mapping[str, object]]) -> str:
    """The prompt text of an OpenAI chat: the simulator's fixed template.

    Each message becomes `<|{role}|>\\n{content}\\n` in order, and `<|assistant|>\\n` follows the last
    one (the generation prompt). `content` is a string, None (empty), or OpenAI's list of parts of which
    the `{"type": "text", "text": ...}` ones are joined with "\\n" (other parts are ignored). Raises
    ValueError on a message without a string role or with content of another shape.
    """
    out: list[str] = []
    for message in messages:
        role = message.get("role")
        if not isinstance(role, str):
            raise ValueError("each message needs a string 'role'")
        out.append(f"<|{role}|>\n{_content_text(message.get('content'))}\n")
    out.append("<|assistant|>\n")
    return "".join(out)


def _content_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, Mapping):
                raise ValueError("content parts must be objects")
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise ValueError("a text content part needs a string 'text'")
                texts.append(text)
        return "\n".join(texts)
    raise ValueError("message content must be a string or a list of content parts")


FILLER_WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on",
    "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they",
    "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more",
    "when", "will", "would", "who", "so", "no", "she", "other", "its", "may", "these", "about", "time",
    "only", "new", "some", "could", "first", "then", "do", "any", "like", "my", "now", "over", "such",
)  # fmt: skip


class FillerText:
    """Deterministic output tokens: common English words, each with a leading space, one token each.

    Request `seed` picks where in the word list a request's output starts; token `index` (0-based)
    walks the list from there, so `token(seed, i)` is O(1) and two requests with the same seed write
    the same text. Immutable after construction; safe to share.
    """

    __slots__ = ("_texts", "ids")

    def __init__(self, words: Sequence[str] = FILLER_WORDS) -> None:
        ids: list[int] = []
        for word in words:
            piece = encode(" " + word)
            if len(piece) != 1:
                raise ValueError(f"filler word {word!r} is not a single token")
            ids.append(piece[0])
        if not ids:
            raise ValueError("FillerText needs at least one word")
        self.ids: tuple[int, ...] = tuple(ids)  # token `index` of seed `seed` is ids[(seed + index) % len]
        self._texts = tuple(" " + w for w in words)

    def token(self, seed: int, index: int) -> int:
        """The id of output token `index` of a request seeded with `seed`."""
        return self.ids[(seed + index) % len(self.ids)]

    def text(self, seed: int, index: int) -> str:
        """`decode_token(self.token(seed, index))`, without decoding."""
        return self._texts[(seed + index) % len(self._texts)]

    def token_ids(self, n: int, seed: int, start: int = 0) -> list[int]:
        """Output tokens `start` .. `start + n - 1` of a request seeded with `seed`."""
        return [self.token(seed, i) for i in range(start, start + n)]
