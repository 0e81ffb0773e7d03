"""A model's own tokenizer, read from the files vLLM reads it from, so kvgate's ids are the engine's.

A directory (`models[].tokenizer`) holds:

- `tokenizer.json` (required): the `tokenizers` library's serialization, loaded by that library —
  the backend transformers' fast tokenizers (and so vLLM) run.
- `tokenizer_config.json` (optional): the named special tokens (`bos_token`, `eos_token`, ... as
  strings or AddedToken objects), `add_bos_token`/`add_eos_token`, and possibly `chat_template` (a
  string, or a list of named templates: `default`, and `tool_use` for requests with tools).
- `chat_template.jinja` (optional): the chat template; when present it wins over the config's, as in
  transformers and vLLM.

Nothing is downloaded and the replica is never asked. What transformers (v5's `TokenizersBackend`)
does on top of the file, kvgate does too: named special tokens missing from the added tokens are added
as special (never split, never normalized); and when the config sets `add_bos_token` or
`add_eos_token` explicitly (or the file has no post-processor), the post-processor becomes
`[bos] $A [eos]` accordingly; otherwise the file's post-processor decides what `add_special_tokens`
adds. Chat prompts are rendered (gateway/chat_template.py) and encoded WITHOUT special tokens (the
template writes them), unless the request sets vLLM's `add_special_tokens`; completions prompts WITH
them (vLLM's default for `/v1/completions`); token-id prompts pass through.

Encoding goes through `encode_batch_fast` with one text: it releases the GIL (`encode` holds it for the
whole call: a thread would not spare the event loop) and skips the character offsets nobody reads.
Thread-safe: the loaded tokenizer and template are not changed after `load_tokenizer_dir`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as RustTokenizer

from gateway.chat_template import ChatTemplate
from gateway.tokenizers import PromptNotReproducible, PromptRejected

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
_FILES = (TOKENIZER_FILE, CONFIG_FILE, TEMPLATE_FILE)
_NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_NO_TEMPLATE = (
    "this model's tokenizer has no chat template (as of transformers v4.44 none is assumed), "
    "so chat requests cannot be served"
)

Signature = tuple[tuple[int, int] | None, ...]


def _signature(directory: Path) -> Signature:
    out: list[tuple[int, int] | None] = []
    for name in _FILES:
        try:
            st = (directory / name).stat()
        except OSError:
            out.append(None)
        else:
            out.append((st.st_mtime_ns, st.st_size))
    return tuple(out)


class HfTokenizer:
    """One model's tokenizer (see the module doc). Build with `load_tokenizer_dir`."""

    releases_gil = True

    def __init__(
        self,
        directory: Path,
        tokenizer: RustTokenizer,
        templates: Mapping[str, ChatTemplate],
        special_tokens: Mapping[str, Any],
        signature: Signature,
    ) -> None:
        self.directory = directory
        self._tok = tokenizer
        self._templates = dict(templates)
        self.special_tokens = dict(special_tokens)
        self._signature = signature

    def unchanged(self, directory: str) -> bool:
        """True when `directory` is where this was loaded from and its files have not changed since."""
        return Path(directory) == self.directory and _signature(self.directory) == self._signature

    def encode_chat(self, messages: Sequence[Any], request: Mapping[str, Any] | None = None) -> list[int]:
        request = request or {}
        template = self._template(request.get("tools") is not None)
        text = template.render(messages, request, self.special_tokens)
        return self.encode_text(text, _flag(request, "add_special_tokens", False))

    def encode_prompt(self, prompt: Any, request: Mapping[str, Any] | None = None) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch: its first prompt
        if isinstance(prompt, str):
            return self.encode_text(prompt, _flag(request or {}, "add_special_tokens", True))
        if isinstance(prompt, list) and all(
            type(t) is int and 0 <= t < 2**32 for t in prompt
        ):  # token ids: the engine takes them as they are
            return list(prompt)
        raise PromptNotReproducible("a prompt that is neither text nor 32-bit token ids")

    def encode_text(self, text: str, add_special_tokens: bool) -> list[int]:
        ids: list[int] = self._tok.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
        return ids

    def _template(self, with_tools: bool) -> ChatTemplate:
        # transformers' get_chat_template: "tool_use" for a request with tools when there is one
        if with_tools and "tool_use" in self._templates:
            return self._templates["tool_use"]
        template = self._templates.get("default")
        if template is None:
            raise PromptRejected(_NO_TEMPLATE)
        return template


def _flag(request: Mapping[str, Any], name: str, default: bool) -> bool:
    value = request.get(name, default)
    if not isinstance(value, bool):
        raise PromptNotReproducible(f"{name} is not a boolean")
    return value


def load_tokenizer_dir(path: str | Path) -> HfTokenizer:
    """Load the tokenizer in directory `path`. Raises ValueError naming the file and what is wrong."""
    directory = Path(path)
    if not directory.is_dir():
        why = "not a directory" if directory.exists() else "no such directory"
        raise ValueError(f"{directory}: {why} (a tokenizer is a directory holding {TOKENIZER_FILE})")
    signature = _signature(directory)
    file = directory / TOKENIZER_FILE
    if not file.is_file():
        raise ValueError(f"{directory}: no {TOKENIZER_FILE} (only fast tokenizers are supported)")
    try:
        tok = RustTokenizer.from_file(str(file))
    except Exception as err:  # the library's errors are plain Exceptions with its parser's message
        raise ValueError(f"{file}: the tokenizers library cannot load it: {err}") from None
    config = _read_config(directory / CONFIG_FILE)
    special = _special_tokens(config, directory / CONFIG_FILE)
    _add_named_tokens(tok, config)
    _update_post_processor(tok, config, special)
    templates = _templates(directory, config)
    # One text per call gains nothing from the library's thread pool (it splits a batch by text), and
    # having used the pool makes every later fork print a warning. An operator's own setting is kept.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return HfTokenizer(directory, tok, templates, special, signature)


def _read_config(file: Path) -> dict[str, Any]:
    if not file.exists():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{file}: cannot be read as JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file}: the top level must be an object")
    return data


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _special_tokens(config: Mapping[str, Any], file: Path) -> dict[str, Any]:
    """What transformers puts in the template's scope: the named special tokens, as text."""
    out: dict[str, Any] = {}
    for name in _NAMED_TOKENS:
        value = config.get(name)
        if value is None:
            continue
        text = _token_text(value)
        if text is None:
            raise ValueError(f"{file}: {name} is neither a string nor a token object with a content")
        out[name] = text
    extra = config.get("additional_special_tokens")
    if isinstance(extra, list):
        out["additional_special_tokens"] = [t for t in map(_token_text, extra) if t is not None]
    return out


def _add_named_tokens(tok: RustTokenizer, config: Mapping[str, Any]) -> None:
    present = {t.content for t in tok.get_added_tokens_decoder().values()}
    for name in _NAMED_TOKENS:
        value = config.get(name)
        text = _token_text(value)
        if text is None or text in present:
            continue
        flags = value if isinstance(value, dict) else {}
        tok.add_special_tokens([AddedToken(
            text,
            single_word=bool(flags.get("single_word", False)),
            lstrip=bool(flags.get("lstrip", False)),
            rstrip=bool(flags.get("rstrip", False)),
            normalized=bool(flags.get("normalized", False)),
            special=True,
        )])  # fmt: skip
        present.add(text)


def _update_post_processor(tok: RustTokenizer, config: Mapping[str, Any], special: Mapping[str, Any]) -> None:
    """transformers' `update_post_processor`, run only when it would run (see the module doc)."""
    if "add_bos_token" not in config and "add_eos_token" not in config and tok.post_processor is not None:
        return
    ends: dict[str, tuple[str, int]] = {}
    for flag, name in (("add_bos_token", "bos_token"), ("add_eos_token", "eos_token")):
        text = special.get(name)
        token_id = tok.token_to_id(text) if isinstance(text, str) and config.get(flag) is True else None
        if token_id is not None:
            ends[name] = (str(text), token_id)
    bos = f"{ends['bos_token'][0]}:0 " if "bos_token" in ends else ""
    eos = f" {ends['eos_token'][0]}:0" if "eos_token" in ends else ""
    single = f"{bos}$A:0{eos}"
    pair = f"{single} {bos.replace(':0', ':1')}$B:1{eos.replace(':0', ':1')}"
    tok.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=list(dict.fromkeys(ends.values()))
    )


def _templates(directory: Path, config: Mapping[str, Any]) -> dict[str, ChatTemplate]:
    sources: dict[str, str] = {}
    value = config.get("chat_template")
    if isinstance(value, str):
        sources["default"] = value
    elif isinstance(value, list):
        for entry in value:
            name, source = (entry.get("name"), entry.get("template")) if isinstance(entry, dict) else (0, 0)
            if isinstance(name, str) and isinstance(source, str):
                sources[name] = source
    elif value is not None:
        raise ValueError(f"{directory / CONFIG_FILE}: chat_template is neither a string nor a list")
    file = directory / TEMPLATE_FILE
    if file.exists():
        try:
            sources["default"] = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"{file}: cannot be read: {err}") from None
    out = {}
    for name, source in sources.items():
        try:
            out[name] = ChatTemplate(source)
        except ValueError as err:
            where = file if name == "default" and file.exists() else directory / CONFIG_FILE
            raise ValueError(f"{where}: {err}") from None
    return out
