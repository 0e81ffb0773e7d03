"""The canonical prompt: the bytes the prefix index cuts into blocks and hashes.

Two requests whose prompts start the same way must produce bytes that start the same way, and two
different prompts must not be able to produce the same bytes. The encoding is therefore:

- chat: every message in the order the client sent it (the system message is normally first; kvgate
  never reorders, because the engine sees the messages in that order too). Each message is a run of
  fields, and each field is `\\x00` + a one-letter tag + the field's text, UTF-8:
  `R` role, `N` name, `T` text content, `X` a non-text part's type, `H` a stable hash of that part's
  payload (image URL, audio data, ...), `F`/`A` a tool call's function name and arguments, `I` the
  tool_call_id. `\\x00` never occurs inside a field: a field's own `\\x01` becomes `\\x01\\x01` and its
  `\\x00` becomes `\\x01\\x02`, so the byte stream decodes one way only. Text content carries no length
  prefix, so a long document followed by different questions in one message still shares its leading
  bytes. A string content and a list of one text part encode the same (the engine renders them the same).
- completions: the prompt string as UTF-8; token ids as 4-byte little-endian unsigned integers (so one
  token is 4 bytes, the same ratio the byte blocks assume); a batch of prompts is canonicalized as its
  first prompt (the batch goes to one replica, and the first prompt decides where its prefix lives).

Text that is not valid Unicode (lone surrogates) is kept with `surrogatepass` rather than refused:
routing is no place to reject a request. Cost: one join and one encode, 10-25 µs for a 128 KB
prompt on the benchmark machine, plus ~1 µs of bookkeeping per message; the escaping only runs on
text that contains `\\x00` or `\\x01`. (With glibc's default malloc settings each temporary of 128 KB
or more is a fresh mmap, which made the same join and encode cost ~200 µs in a tight loop;
`MALLOC_MMAP_THRESHOLD_=4194304` in the process environment removes that.)
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import xxhash

_SEP = "\x00"
_ESC = "\x01"
# Non-text parts name their payload under a key that depends on the part type; the first of these that
# holds a string is hashed into the marker so two different images are two different prompts.
_PAYLOAD_KEYS = ("url", "data", "file_id", "file_data", "id")


def canonical_chat_bytes(messages: Sequence[Any]) -> bytes:
    """The canonical bytes of a chat `messages` list (OpenAI shape, as parsed JSON).

    Never raises for any JSON value: unexpected shapes get a stable marker instead. Leading messages
    that are equal produce equal leading bytes.
    """
    out: list[str] = []
    add = out.append
    for message in messages:
        if type(message) is dict and len(message) == 2:
            # The common shape, {"role": str, "content": str} with nothing to escape: its two fields as
            # one piece and the text, without the lookups of fields it cannot have (-10% of the cost).
            role = message.get("role")
            content = message.get("content")
            if (
                type(role) is str
                and type(content) is str
                and _SEP not in role
                and _ESC not in role
                and _SEP not in content
                and _ESC not in content
            ):
                add("\x00R" + role + "\x00T")
                add(content)
                continue
        # `type(...) is dict` first: parsed JSON is always a dict, and the Mapping ABC check is slow.
        if type(message) is not dict and not isinstance(message, Mapping):
            add("\x00?" + type(message).__name__)
            continue
        get = message.get
        role = get("role")
        # Roles and texts rarely hold \x00 or \x01: check inline (memchr) and escape only if they do.
        if type(role) is str and _SEP not in role and _ESC not in role:
            add("\x00R" + role)
        else:
            add("\x00R" + _field(role))
        name = get("name")
        if name is not None:
            add("\x00N")
            add(_field(name))
        content = get("content")
        if isinstance(content, str):
            add("\x00T")
            # Appended, not concatenated: a long text is copied once, by the join.
            add(content if _SEP not in content and _ESC not in content else _escaped(content))
        elif isinstance(content, list):
            for part in content:
                _add_part(add, part)
        elif content is not None:
            add("\x00?" + type(content).__name__)
        tool_calls = get("tool_calls")
        if tool_calls and isinstance(tool_calls, list):
            for call in tool_calls:
                function = call.get("function") if isinstance(call, Mapping) else None
                if isinstance(function, Mapping):
                    add("\x00F" + _field(function.get("name")) + "\x00A" + _field(function.get("arguments")))
                else:
                    add("\x00F?")
        tool_call_id = get("tool_call_id")
        if tool_call_id is not None:
            add("\x00I")
            add(_field(tool_call_id))
    return "".join(out).encode("utf-8", "surrogatepass")


def canonical_completion_bytes(prompt: str | Sequence[Any]) -> bytes:
    """The canonical bytes of a completions `prompt`: a string, token ids, or a batch of either.

    Token ids must be integers in [0, 2**32); anything else raises ValueError (the request parser has
    already refused such prompts, so this is a contract check, not input validation).
    """
    if isinstance(prompt, str):
        return prompt.encode("utf-8", "surrogatepass")
    if not prompt:
        return b""
    first = prompt[0]
    if isinstance(first, str | list | tuple):
        return canonical_completion_bytes(first)
    return pack_token_ids(cast(Sequence[int], prompt))


def batch_prompts(prompt: Any) -> Sequence[Any] | None:
    """The prompts of a completions batch (a list of strings or a list of token-id lists), or None
    when `prompt` is one prompt (a string or a flat list of token ids). One type check for one prompt:
    the common case pays nothing more."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return prompt
    return None


def pack_token_ids(token_ids: Sequence[int]) -> bytes:
    """Token ids as 4-byte little-endian unsigned integers; ValueError outside [0, 2**32) or non-int.

    About 20 ns per id on this machine (150 µs for 8k ids): the array conversion is the whole cost.
    """
    packed = array("I")
    if packed.itemsize != 4:  # pragma: no cover - 'I' is 4 bytes on every platform CPython supports
        packed = array("L")
    try:
        packed.fromlist(token_ids if isinstance(token_ids, list) else list(token_ids))
    except (OverflowError, TypeError) as err:
        raise ValueError(f"token ids must be integers in [0, 2**32): {err}") from None
    if sys.byteorder != "little":  # pragma: no cover - the byte encoding is fixed, the host is not
        packed.byteswap()
    return packed.tobytes()


def _escaped(text: str) -> str:
    # `in` is a memchr scan (~3 µs per 128 KB); str.replace scans far slower even when nothing matches.
    if _SEP in text or _ESC in text:
        return text.replace(_ESC, "\x01\x01").replace(_SEP, "\x01\x02")
    return text


def _field(value: Any) -> str:
    if isinstance(value, str):
        return _escaped(value)
    if value is None:
        return ""
    return _escaped(str(value))


def _add_part(add: Callable[[str], object], part: Any) -> None:
    if type(part) is not dict and not isinstance(part, Mapping):
        add("\x00?" + type(part).__name__)
        return
    kind = part.get("type")
    if kind == "text":
        add("\x00T")
        add(_field(part.get("text")))
        return
    add("\x00X" + _field(kind) + "\x00H" + _payload_hash(part.get(kind) if isinstance(kind, str) else None))


def _payload_hash(payload: Any) -> str:
    if isinstance(payload, Mapping):
        for key in _PAYLOAD_KEYS:
            value = payload.get(key)
            if isinstance(value, str):
                payload = value
                break
    if isinstance(payload, str):
        return xxhash.xxh3_64_hexdigest(payload.encode("utf-8", "surrogatepass"))
    return ""
