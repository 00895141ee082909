"""Chat templates: the tokenizer's own by default, a few named fallbacks, and turn segments for label masks.

:func:`render` turns messages into the text a model sees. ``template=None`` uses the tokenizer's own Jinja
template (``tokenizer.apply_chat_template``), which is what the model was trained with; a name picks one of
:data:`TEMPLATES`, for tokenizers without a template or to override a wrong one.

:func:`segments` splits a rendered conversation into ``(text, trained)`` pieces by rendering prefixes of the
conversation incrementally. It needs no template-specific markers, so label masks work for any template whose
render of a prefix is a prefix of the render of the whole (true of ChatML, Llama, Qwen2.5 ...; templates that
rewrite earlier turns, such as ones that strip reasoning from past turns, are rejected loudly).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from roll.core.errors import ConfigError, ConfigIssue, DataError

Message = dict[str, str]
ROLES = ("system", "user", "assistant", "tool")
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


class ChatTokenizer(Protocol):
    """What rendering needs of a tokenizer (a transformers tokenizer satisfies it)."""

    chat_template: Any
    eos_token: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


TemplateFn = Callable[[Sequence[Message], bool, str], str]
"""``fn(messages, add_generation_prompt, eos_token) -> text``."""


def _chatml(messages: Sequence[Message], add_generation_prompt: bool, eos_token: str) -> str:
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def _qwen(messages: Sequence[Message], add_generation_prompt: bool, eos_token: str) -> str:
    if not messages or messages[0]["role"] != "system":
        messages = [{"role": "system", "content": QWEN_DEFAULT_SYSTEM}, *messages]
    return _chatml(messages, add_generation_prompt, eos_token)


def _plain(messages: Sequence[Message], add_generation_prompt: bool, eos_token: str) -> str:
    """``System: ...`` / ``User: ...`` / ``Assistant: ...<eos>`` lines; the eos teaches the model to stop."""
    parts = []
    for m in messages:
        end = eos_token if m["role"] == "assistant" else ""
        parts.append(f"{m['role'].capitalize()}: {m['content']}{end}\n")
    return "".join(parts) + ("Assistant: " if add_generation_prompt else "")


TEMPLATES: dict[str, TemplateFn] = {"chatml": _chatml, "qwen": _qwen, "plain": _plain}
"""Named fallback templates. ``qwen`` is ChatML with Qwen2.5's default system prompt when none is given."""


def get_template(name: str) -> TemplateFn:
    """The registered template ``name``; an unknown name raises and lists the known ones."""
    try:
        return TEMPLATES[name]
    except KeyError:
        issue = ConfigIssue(
            path="template",
            message=f"unknown chat template {name!r}",
            hint=f"known templates: {sorted(TEMPLATES)}",
        )
        raise ConfigError(issues=[issue]) from None


SHAREGPT_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "system": "system",
    "user": "user",
    "assistant": "assistant",
}
"""ShareGPT's ``from`` names and the roles they mean."""


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> list[Message]:
    """Check roles and contents; return plain ``{"role", "content"}`` dicts.

    Turns in ShareGPT's layout (``{"from": "human" | "gpt" | "system", "value": ...}``) are read as the
    ``role``/``content`` turns they stand for, so such a column works as ``messages`` without rewriting.
    """
    out: list[Message] = []
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        if role is None and "from" in m:
            role, content = SHAREGPT_ROLES.get(str(m["from"]), m["from"]), m.get("value")
        if role not in ROLES:
            raise DataError(f"messages[{i}]: role {role!r} is not one of {list(ROLES)}")
        if not isinstance(content, str):
            raise DataError(f"messages[{i}] ({role}): content must be a string, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    return out


def render(
    messages: Sequence[Mapping[str, Any]],
    *,
    template: str | None,
    tokenizer: ChatTokenizer | None,
    add_generation_prompt: bool,
) -> str:
    """Render ``messages`` to text with the named template, or the tokenizer's own when ``template`` is None."""
    msgs = validate_messages(messages)
    if template is not None:
        eos = str(getattr(tokenizer, "eos_token", None) or "")
        return get_template(template)(msgs, add_generation_prompt, eos)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        issue = ConfigIssue(
            path="template",
            message="the tokenizer has no chat template",
            hint=f"name a fallback template, one of {sorted(TEMPLATES)}",
        )
        raise ConfigError(issues=[issue])
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
    return str(text)


def row_messages(row: Mapping[str, Any], *, with_response: bool = True) -> list[Message]:
    """The conversation of a canonical row: its ``messages`` (or a ``prompt`` that is a list of messages, the
    conversational layout TRL uses), else one built from system/prompt/query/response.

    ``prompt`` and ``query`` (an instruction and its input, alpaca style) join with a blank line into one user
    turn. ``with_response=False`` leaves out the assistant turn (RL prompts, preference prompts).
    """
    if row.get("messages") or isinstance(row.get("prompt"), list):
        msgs = validate_messages(row.get("messages") or row["prompt"])
        return msgs if with_response or msgs[-1]["role"] != "assistant" else msgs[:-1]
    user = "\n\n".join(str(row[k]) for k in ("prompt", "query") if row.get(k) is not None)
    msgs = [{"role": "system", "content": str(row["system"])}] if row.get("system") else []
    msgs.append({"role": "user", "content": user})
    if with_response and row.get("response") is not None:
        msgs.append({"role": "assistant", "content": str(row["response"])})
    return msgs


def segments(
    messages: Sequence[Mapping[str, Any]], *, template: str | None, tokenizer: ChatTokenizer | None
) -> list[tuple[str, bool]]:
    """Split the rendered conversation into ``(text, trained)`` pieces; assistant turns are trained.

    An assistant turn spans from the end of the generation prompt that precedes it to the end of its own render
    (its content plus whatever the template closes it with, e.g. ``<|im_end|>\\n``), so the model learns to
    stop. Everything else (system, user, role headers) is context. Joining the texts gives the full render.
    """
    msgs = validate_messages(messages)

    def draw(upto: int, gen: bool) -> str:
        return render(msgs[:upto], template=template, tokenizer=tokenizer, add_generation_prompt=gen)

    full = draw(len(msgs), False)
    pieces: list[tuple[str, bool]] = []
    pos = 0
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before, through = draw(i, True), draw(i + 1, False)
        start, end = len(before), len(through)
        if not (full.startswith(before) and full.startswith(through)) or start < pos:
            raise DataError(
                f"chat template is not prefix-stable at message {i}: rendering the conversation up to a turn "
                "does not give a prefix of the whole render, so turn boundaries cannot be found; use a "
                f"registered template ({sorted(TEMPLATES)}) or a template that does not rewrite earlier turns"
            )
        pieces += [(full[pos:start], False), (full[start:end], True)]
        pos = end
    pieces.append((full[pos:], False))
    return [(text, trained) for text, trained in pieces if text]
