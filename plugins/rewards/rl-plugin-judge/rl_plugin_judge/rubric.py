"""The rubric: a ``str.format`` template the judge is asked with, one message per completion.

``{prompt}`` is the question the policy was asked (the prompt's last user message), ``{completion}``
the policy's answer (its final assistant message), ``{max_score}`` the top of the scale, and any
other ``{name}`` the dataset column of that name (``{answer}``, ``{solution}``, …). Literal braces
are doubled (``{{`` and ``}}``), as in any ``str.format`` string.
"""

from __future__ import annotations

import string
from typing import Any, Mapping, Sequence

from rlcore.errors import ConfigError

#: the fields every rubric may use besides dataset columns
BUILT_IN_FIELDS = ("prompt", "completion", "max_score")

DEFAULT_RUBRIC = """You are grading an AI assistant's answer to a user's request.

[Request]
{prompt}

[Answer]
{completion}

Judge the answer's correctness, helpfulness and clarity. Think briefly, then give a score from 0 \
(useless or wrong) to {max_score} (excellent) on the last line, written exactly as "Score: N"."""


def rubric_fields(template: str) -> list[str]:
    """The field names ``template`` uses, in order; :class:`ConfigError` for a template
    ``str.format`` cannot read, a positional field (``{}``, ``{0}``) or an attribute/index one."""
    fields: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"llm_judge: the rubric is not a valid template ({exc}); write literal braces as {{{{ and }}}}") from None
    for _, name, _, _ in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            raise ConfigError(f"llm_judge: the rubric has the field {{{name}}}; use named fields such as {{prompt}}, "
                              "{completion} or a dataset column ({answer}), and write literal braces as {{ and }}")
        if name not in fields:
            fields.append(name)
    return fields


def prompt_text(messages: Sequence[Mapping[str, Any]] | str | None) -> str:
    """What the policy was asked: the last user message of a chat prompt (all messages' text when
    none is the user's), or the prompt itself when it is text."""
    if messages is None:
        return ""
    if isinstance(messages, str):
        return messages
    for m in reversed(list(messages)):
        if m.get("role") == "user":
            return _content(m.get("content"))
    return "\n\n".join(_content(m.get("content")) for m in messages)


def _content(content: Any) -> str:
    """A message's text (OpenAI-style content parts joined)."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def render(template: str, fields: Mapping[str, Any]) -> str:
    """The rubric filled in (the caller checked that every field it names is in ``fields``)."""
    return template.format_map({k: "" if v is None else v for k, v in fields.items()})
