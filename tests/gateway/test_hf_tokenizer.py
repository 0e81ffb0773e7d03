"""gateway/hf_tokenizer.py: loading a model's tokenizer directory as transformers (and so vLLM) would, and
refusing one that cannot be used with the file and the reason."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from gateway.hf_tokenizer import load_tokenizer_dir
from gateway.tokenizers import PromptNotReproducible, PromptRejected, SimTokenizer, tokenizer_for
from tests.vllm_fixtures import VLLM_FIXTURES

FIXTURE = VLLM_FIXTURES / "tiny-llama-tokenizer"
BOS, EOS = 1, 2
CHAT = [{"role": "user", "content": "hello"}]


def copy(tmp_path: Path, config: dict[str, Any] | None = None, template: str | None = None) -> Path:
    """The fixture tokenizer in a directory of its own, with `config` merged into its config and
    `template` as its chat_template.jinja (None: the fixture's; "": none)."""
    d = tmp_path / "tok"
    shutil.copytree(FIXTURE, d)
    if config is not None:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        (d / "tokenizer_config.json").write_text(json.dumps({**cfg, **config}))
    if template == "":
        (d / "chat_template.jinja").unlink()
    elif template is not None:
        (d / "chat_template.jinja").write_text(template)
    return d


def test_completions_get_what_the_post_processor_adds_and_chats_what_the_template_writes() -> None:
    tok = load_tokenizer_dir(FIXTURE)
    plain = tok.encode_text("t1 w1 ", add_special_tokens=False)
    assert tok.encode_prompt("t1 w1 ") == plain  # this tokenizer's post-processor adds nothing
    assert tok.encode_chat(CHAT)[0] == BOS and tok.encode_chat(CHAT).count(BOS) == 1
    assert tok.encode_prompt([5, 6, 7]) == [5, 6, 7]  # token ids pass through
    assert tok.encode_prompt(["t1 w1 ", "other"]) == plain  # a batch: its first prompt
    assert tok.encode_prompt([[9, 8], [7]]) == [9, 8]


@pytest.mark.parametrize(
    ("config", "first", "last"),
    [({"add_bos_token": True}, BOS, None), ({"add_bos_token": True, "add_eos_token": True}, BOS, EOS),
     ({"add_eos_token": True}, None, EOS), ({"add_bos_token": False}, None, None)],
)  # fmt: skip
def test_an_explicit_add_bos_or_eos_token_rebuilds_the_post_processor(
    tmp_path: Path, config: dict[str, Any], first: int | None, last: int | None
) -> None:
    tok = load_tokenizer_dir(copy(tmp_path, config))
    plain = tok.encode_text("t1 w1 ", add_special_tokens=False)
    assert tok.encode_prompt("t1 w1 ") == [*([first] if first else []), *plain, *([last] if last else [])]
    assert tok.encode_prompt("t1 w1 ", {"add_special_tokens": False}) == plain
    # A chat is encoded without them unless the request asks (vLLM's add_special_tokens, default false).
    chat = tok.encode_chat(CHAT)
    assert tok.encode_chat(CHAT, {"add_special_tokens": True}) == [*([first] if first else []), *chat,
                                                                    *([last] if last else [])]  # fmt: skip


def test_chat_template_jinja_wins_over_the_configs_and_a_list_has_a_tool_use_template(tmp_path: Path) -> None:
    named = [{"name": "default", "template": "D{{ messages[0].content }}"},
             {"name": "tool_use", "template": "T{{ tools[0].function.name }}"}]  # fmt: skip
    tok = load_tokenizer_dir(copy(tmp_path, {"chat_template": named}, template=""))
    assert tok.encode_chat(CHAT) == tok.encode_text("Dhello", False)
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert tok.encode_chat(CHAT, {"tools": tools}) == tok.encode_text("Tf", False)
    (tmp_path / "tok" / "chat_template.jinja").write_text("J{{ messages[0].content }}")
    assert load_tokenizer_dir(tmp_path / "tok").encode_chat(CHAT) == tok.encode_text("Jhello", False)


def test_without_a_chat_template_a_chat_is_rejected_and_a_completion_still_works(tmp_path: Path) -> None:
    tok = load_tokenizer_dir(copy(tmp_path, template=""))
    with pytest.raises(PromptRejected, match="no chat template"):
        tok.encode_chat(CHAT)
    assert tok.encode_prompt("x")


def test_a_named_special_token_missing_from_the_file_is_added_unsplittable(tmp_path: Path) -> None:
    tok = load_tokenizer_dir(copy(tmp_path, {"bos_token": "<|begin|>", "add_bos_token": True}))
    ids = tok.encode_prompt("a<|begin|>b")
    assert len(ids) == 4 and ids[0] == ids[2] == 2048  # a new id, as BOS and inside the text, unsplit
    assert tok.special_tokens["bos_token"] == "<|begin|>"


@pytest.mark.parametrize(
    ("prompt", "request_"),
    [([1, -2], None), ([2**32], None), ([True], None), ("x", {"add_special_tokens": "yes"})],
)
def test_prompts_it_cannot_reproduce(prompt: Any, request_: dict[str, Any] | None) -> None:
    with pytest.raises(PromptNotReproducible):
        load_tokenizer_dir(FIXTURE).encode_prompt(prompt, request_)


# --- refused directories ------------------------------------------------------------------------------


def test_unusable_directories_are_refused_with_the_file_and_the_reason(tmp_path: Path) -> None:
    cases: list[tuple[Path, str]] = [(tmp_path / "nowhere", "no such directory")]
    (tmp_path / "file").write_text("x")
    cases.append((tmp_path / "file", "not a directory"))
    (tmp_path / "empty").mkdir()
    cases.append((tmp_path / "empty", "no tokenizer.json"))
    for name, files, reason in [
        ("badjson", {"tokenizer.json": "{"}, "tokenizer.json: the tokenizers library cannot load it"),
        ("badcfg", {"tokenizer_config.json": "[1,"}, "tokenizer_config.json: cannot be read as JSON"),
        ("cfglist", {"tokenizer_config.json": "[1]"}, "tokenizer_config.json: the top level must be an"),
        ("badtok", {"tokenizer_config.json": '{"bos_token": 5}'}, "bos_token is neither"),
        ("badtpl", {"chat_template.jinja": "{% if %}"}, "chat_template.jinja: the chat template does not"),
        ("badcfgtpl", {"tokenizer_config.json": '{"chat_template": "{% for %}"}',
                       "chat_template.jinja": None}, "tokenizer_config.json: the chat template does not"),
    ]:  # fmt: skip
        d = tmp_path / name
        shutil.copytree(FIXTURE, d)
        for file, text in files.items():
            if text is None:
                (d / file).unlink()
            else:
                (d / file).write_text(text)
        cases.append((d, reason))
    for directory, reason in cases:
        with pytest.raises(ValueError, match=reason) as err:
            load_tokenizer_dir(directory)
        assert str(directory) in str(err.value)


def test_a_reload_keeps_a_tokenizer_whose_files_did_not_change(tmp_path: Path) -> None:
    d = copy(tmp_path)
    first = tokenizer_for(str(d))
    assert tokenizer_for(str(d), first) is first
    assert tokenizer_for(str(tmp_path / "tok" / "."), first) is first  # the same directory
    template = d / "chat_template.jinja"
    template.write_text("X{{ messages[0].content }}")
    os.utime(template, ns=(1, 1))  # a changed mtime even on a coarse clock
    second = tokenizer_for(str(d), first)
    assert second is not first and second is not None
    assert second.encode_chat(CHAT) != first.encode_chat(CHAT)  # type: ignore[union-attr]
    assert isinstance(tokenizer_for("sim", SimTokenizer()), SimTokenizer)
    assert tokenizer_for("none", first) is None
