"""A model's chat template, rendered the way vLLM renders it (through transformers).

The environment is transformers' (`chat_template_utils._compile_jinja_template`): jinja2's
`ImmutableSandboxedEnvironment` with `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension
and the `{% generation %}` tag (rendered as its body), a `tojson` filter that does not escape HTML
(`json.dumps`, `ensure_ascii=False`), and the globals `raise_exception` and `strftime_now`. The
template sees `messages` (the conversation of gateway/chat_messages.py), `tools`, `documents`,
`add_generation_prompt`, the tokenizer's named special tokens (`bos_token`, `eos_token`, ...) and the
request's `chat_template_kwargs` (vLLM keeps only the names the template uses; one it does not use
cannot change the text). vLLM's request fields map on as in its `build_chat_params`:
`add_generation_prompt` (default true) and `continue_final_message` (default false) win over the same
names in `chat_template_kwargs`, as do `documents` and `reasoning_effort` when given (with
`enable_thinking = reasoning_effort != "none"` unless the kwargs name it).

Whether a message's content reaches the template as a string or as a list of parts is vLLM's guess
from the template's syntax tree (`_detect_content_format`): a `for` loop over a message's `content`
(a message being a loop variable over `messages` or over a name assigned from it) means "openai",
anything else "string".

A compiled template is immutable and may be rendered from several threads at once.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox

from gateway.chat_messages import ContentFormat, conversation
from gateway.tokenizers import PromptNotReproducible, PromptRejected

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' marker for continue_final_message
# vLLM refuses these in chat_template_kwargs; the others collide with apply_chat_template's own
# parameters, which kvgate does not try to reproduce.
_REFUSED_KWARGS = frozenset({"chat_template", "tokenize"})
_UNREPRODUCED_KWARGS = frozenset({"messages", "conversation", "tools"})
_NAMED = frozenset({"add_generation_prompt", "continue_final_message", "documents"})  # always passed


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers tracks the assistant's characters with it;
    for rendering it is its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """One compiled template. Raises ValueError at construction for a template jinja2 cannot parse."""

    def __init__(self, source: str) -> None:
        env = _environment()
        try:
            ast = env.parse(source)
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateError as err:
            raise ValueError(f"the chat template does not parse: {err}") from None
        self._mentions_continue = "content" in source  # transformers checks the field name's text
        self.variables = frozenset(jinja2.meta.find_undeclared_variables(ast))
        self.content_format: ContentFormat = _content_format(ast)

    def render(
        self, messages: Sequence[Any], request: Mapping[str, Any], special_tokens: Mapping[str, Any]
    ) -> str:
        """The prompt text for `messages` with the options of `request` (the chat request body).
        Raises PromptRejected where vLLM answers 400 (the template raised, options that conflict) and
        PromptNotReproducible where kvgate does not follow (gateway/chat_messages.py)."""
        chat = conversation(messages, self.content_format)
        kwargs = self._kwargs(request)
        generation_prompt = kwargs.pop("add_generation_prompt", True)
        continue_final = kwargs.pop("continue_final_message", False)
        documents = kwargs.pop("documents", None)
        if documents is not None and not (
            isinstance(documents, list) and all(isinstance(d, dict) for d in documents)
        ):
            raise PromptNotReproducible("documents is not a list of objects")
        if continue_final and generation_prompt:
            raise PromptRejected("continue_final_message and add_generation_prompt cannot both be true")
        final = self._mark_final_message(chat) if continue_final else ""
        scope = {**special_tokens, **kwargs}
        try:
            text = self._template.render(
                messages=chat,
                tools=_tools(request.get("tools")),
                documents=documents,
                add_generation_prompt=generation_prompt,
                **scope,
            )
        except Exception as err:  # vLLM turns any failure of the template into a 400 with its message
            raise PromptRejected(f"the chat template failed: {err}") from None
        return _cut_after_final(text, final) if continue_final else text

    def _kwargs(self, request: Mapping[str, Any]) -> dict[str, Any]:
        given = request.get("chat_template_kwargs")
        if given is None:
            given = {}
        if not isinstance(given, Mapping):
            raise PromptNotReproducible("chat_template_kwargs is not an object")
        refused = _REFUSED_KWARGS & given.keys()
        if refused:
            raise PromptRejected(f"unexpected chat template kwargs from the request: {sorted(refused)}")
        if _UNREPRODUCED_KWARGS & given.keys():
            raise PromptNotReproducible("chat_template_kwargs names an apply_chat_template parameter")
        kwargs = {k: v for k, v in given.items() if k in self.variables or k in _NAMED}
        for name, default in (("add_generation_prompt", True), ("continue_final_message", False)):
            value = request.get(name, default)
            if not isinstance(value, bool):
                raise PromptNotReproducible(f"{name} is not a boolean")
            kwargs[name] = value
        for name in ("documents", "reasoning_effort"):
            if request.get(name) is not None:
                kwargs[name] = request[name]
        effort = request.get("reasoning_effort")
        if effort is not None and "enable_thinking" not in given:
            kwargs["enable_thinking"] = effort != "none"
        if "enable_thinking" in kwargs and "enable_thinking" not in self.variables:
            del kwargs["enable_thinking"]
        if "reasoning_effort" in kwargs and "reasoning_effort" not in self.variables:
            del kwargs["reasoning_effort"]
        return kwargs

    def _mark_final_message(self, chat: list[dict[str, Any]]) -> str:
        """transformers' continue_final_message: tag the last message's text so the render can be cut
        right after it. Returns that text."""
        if not chat or chat[-1].get("content") is None:
            raise PromptRejected("continue_final_message is set but the final message has no content")
        if not self._mentions_continue:
            raise PromptRejected("continue_final_message is set but the chat template has no 'content'")
        content = chat[-1]["content"]
        if isinstance(content, list):
            for block in reversed(content):
                if isinstance(block, dict) and "text" in block:
                    final = str(block["text"])
                    block["text"] = final + _CONTINUE_TAG
                    return final
            raise PromptRejected("continue_final_message is set but the final message has no text")
        final = str(content)
        chat[-1]["content"] = final + _CONTINUE_TAG
        return final


def _cut_after_final(text: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise PromptRejected("continue_final_message is set but the chat template drops the final message")
    at = text.rindex(tag)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()  # the template trimmed the message's trailing space


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """The request's tools as vLLM dumps its pydantic models for the template: `type` and `function`
    only, the function's `name`, `description` and `parameters` always present (null when absent)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise PromptNotReproducible("tools is not a list")
    out = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise PromptNotReproducible("a tool without a named function")
        dumped = {"name": function["name"], "description": function.get("description"),
                  "parameters": function.get("parameters")}  # fmt: skip
        dumped.update((k, v) for k, v in function.items() if k not in dumped and k != "defer_loading")
        entry: dict[str, Any] = {"type": tool.get("type", "function"), "function": dumped}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
        out.append(entry)
    return out


# --- content format: vLLM's syntax-tree guess ------------------------------------------------------------


def _content_format(ast: jinja2.nodes.Template) -> ContentFormat:
    try:
        loops_over_content = next(_content_loops(ast), None) is not None
    except Exception:  # a shape the walk does not expect: vLLM falls back to "string" too
        return "string"
    return "openai" if loops_over_content else "string"


def _is_name(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_item(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        arg = node.arg
        return _is_name(node.node, name) and isinstance(arg, jinja2.nodes.Const) and arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_name(node.node, name) and node.attr == key
    return False


def _reads(node: jinja2.nodes.Node, name: str, key: str | None = None) -> bool:
    """`node` reads `name` (or `name[key]`), possibly through filters, tests and slices."""
    if isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _reads(node.node, name, key)
    return _is_item(node, name, key) if key else _is_name(node, name)


def _aliases(ast: jinja2.nodes.Template, name: str) -> Iterator[str]:
    """`name` and every name assigned from it (or from such a name), breadth first."""
    yield name
    pending = deque([name])
    while pending:
        current = pending.popleft()
        for assign in ast.find_all(jinja2.nodes.Assign):
            if _reads(assign.node, current):
                target = assign.target
                if not isinstance(target, jinja2.nodes.Name):
                    raise ValueError("assignment to a non-name")
                yield target.name
                if target.name != current:
                    pending.append(target.name)


def _loop_targets(ast: jinja2.nodes.Template, names: Sequence[str], key: str | None) -> Iterator[str]:
    for loop in ast.find_all(jinja2.nodes.For):
        if any(_reads(loop.iter, n, key) for n in names):
            if not isinstance(loop.target, jinja2.nodes.Name):
                raise ValueError("a loop over messages with a non-name target")
            yield loop.target.name


def _content_loops(ast: jinja2.nodes.Template) -> Iterator[str]:
    message_names = list(_loop_targets(ast, list(_aliases(ast, "messages")), None))
    return _loop_targets(ast, message_names, "content")
