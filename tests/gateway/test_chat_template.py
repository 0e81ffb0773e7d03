"""gateway/chat_template.py and gateway/chat_messages.py: what a chat template sees and renders, as vLLM
(through transformers) renders it."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.chat_messages import conversation
from gateway.chat_template import ChatTemplate
from gateway.tokenizers import PromptNotReproducible, PromptRejected

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
# Prints content as it arrives: a string, or the list of parts (its JSON).
PLAIN = "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}" \
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"  # fmt: skip
# Loops over a message's content: vLLM hands such a template lists of parts.
PARTS = (
    "{% for m in messages %}[{{ m.role }}]{% for p in m['content'] %}({{ p.text }}){% endfor %}{% endfor %}"
)


def render(source: str, messages: list[dict[str, Any]], **request: Any) -> str:
    return ChatTemplate(source).render(messages, request, SPECIAL)


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


# --- content format -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "fmt"),
    [
        (PLAIN, "string"),
        (PARTS, "openai"),
        ("{% for message in messages %}{% for c in message.content | selectattr('type') %}{% endfor %}"
         "{% endfor %}", "openai"),  # through a filter
        ("{% set msgs = messages[1:] %}{% for m in msgs %}{% for c in m['content'] %}{% endfor %}"
         "{% endfor %}", "openai"),  # through an assignment and a slice
        ("{% for c in messages[0]['content'] %}{% endfor %}", "string"),  # not a loop variable
        ("{% for i, m in messages %}{% endfor %}", "string"),  # a shape vLLM's walk gives up on
    ],
)  # fmt: skip
def test_content_format_is_vllms_guess_from_the_syntax_tree(source: str, fmt: str) -> None:
    assert ChatTemplate(source).content_format == fmt


def test_string_format_joins_text_parts_with_a_newline_and_none_is_empty() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": None},
             {"type": "refusal", "refusal": "b"}, "c", {"type": "input_text", "text": "d"}]  # fmt: skip
    chat = conversation([user(parts), {"role": "assistant", "content": None}], "string")
    assert chat == [{"role": "user", "content": "a\nb\nc\nd"}, {"role": "assistant", "content": ""}]
    assert render(PLAIN, [user(parts)]) == "<s><|user|>a\nb\nc\nd\n<|assistant|>"
    assert render(PLAIN, [user("a\nb\nc\nd")]) == render(PLAIN, [user(parts)])


def test_openai_format_wraps_a_string_content_in_a_text_part() -> None:
    assert render(PARTS, [user("hi"), user([{"type": "text", "text": "x"}, "y"])]) == "[user](hi)[user](x)(y)"


def test_tool_calls_arguments_are_parsed_and_the_clients_message_is_untouched() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    bad = {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}}
    message = {"role": "assistant", "content": None, "tool_calls": [call, bad], "reasoning_content": "r"}
    chat = conversation([message], "string")
    assert [c["function"]["arguments"] for c in chat[0]["tool_calls"]] == [{"x": 1}, {}]
    assert chat[0]["reasoning"] == chat[0]["reasoning_content"] == "r"
    assert call["function"]["arguments"] == '{"x": 1}'  # copied, not parsed in place
    assert (
        "tool_calls"
        not in conversation([{"role": "assistant", "content": "x", "tool_calls": []}], "string")[0]
    )


def test_tool_message_parts_become_a_string_and_keep_their_call_id() -> None:
    tool = {
        "role": "tool",
        "tool_call_id": "c1",
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    }
    assert conversation([tool], "openai") == [{"role": "tool", "content": "a\nb", "tool_call_id": "c1"}]


@pytest.mark.parametrize(
    "message",
    [
        user(
            [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
        ),  # media: the processor's placeholders
        user([{"type": "mystery"}]),
        user([{"type": "text", "text": "x", "uuid": "u1"}]),
        user(42),
        {"role": "assistant", "content": "x", "tool_calls": [{"id": "c"}]},
        {"content": "no role"},
    ],
)
def test_what_kvgate_cannot_reproduce_is_said_so(message: dict[str, Any]) -> None:
    with pytest.raises(PromptNotReproducible):
        render(PLAIN, [message])


# --- rendering -------------------------------------------------------------------------------------------


def test_environment_is_transformers() -> None:
    source = ("{%- for m in messages %}\n  {{- m.content | tojson }}\n{%- endfor %}"
              "{% generation %}G{% endgeneration %}"
              "{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"
              "|{{ strftime_now('%Y') | length }}")  # fmt: skip
    assert render(source, [user("<é>")]) == '"<é>"G1|4'  # tojson: no HTML escaping, no ASCII escaping


def test_trim_and_lstrip_blocks_are_on() -> None:
    source = "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}"
    assert render(source, [user("a"), user("b")]) == "a\nb\n"


def test_raise_exception_is_a_rejection_with_the_templates_message() -> None:
    source = "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    with pytest.raises(PromptRejected, match="system first"):
        render(source, [user("x")])
    with pytest.raises(PromptRejected, match="failed"):
        render("{{ messages[0].content + 1 }}", [user("x")])


def test_request_options_reach_the_template() -> None:
    source = (
        "{{ add_generation_prompt }}|{{ flag }}|{{ enable_thinking }}|{{ documents | length }}"
        "|{{ tools[0] | tojson }}"
    )
    text = render(source, [user("x")], add_generation_prompt=False, reasoning_effort="none",
                  chat_template_kwargs={"flag": 7, "add_generation_prompt": True, "unused": 1},
                  documents=[{"title": "t", "text": "d"}],
                  tools=[{"type": "function", "function": {"name": "f"}, "extra": 1}])  # fmt: skip
    assert text == 'False|7|False|1|{"type": "function", "function": {"name": "f", "description": null, ' \
                   '"parameters": null}}'  # fmt: skip
    with pytest.raises(PromptRejected, match="chat_template"):
        render(PLAIN, [user("x")], chat_template_kwargs={"chat_template": "{{ 1 }}"})


def test_continue_final_message_cuts_the_render_after_it() -> None:
    messages = [user("q"), {"role": "assistant", "content": "The answer is"}]
    text = render(PLAIN, messages, add_generation_prompt=False, continue_final_message=True)
    assert text == "<s><|user|>q\n<|assistant|>The answer is"
    with pytest.raises(PromptRejected, match="cannot both"):
        render(PLAIN, messages, continue_final_message=True)  # add_generation_prompt defaults to true


def test_a_template_that_does_not_parse_is_refused_at_load() -> None:
    with pytest.raises(ValueError, match="does not parse"):
        ChatTemplate("{% for m in messages %}")
