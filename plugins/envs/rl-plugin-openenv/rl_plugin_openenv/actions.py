"""Default text ⇄ OpenEnv conversions: model reply → action dict, observation dict → user message.

Kept as plain functions so a scheduler subclass for another environment can reuse pieces of them.
"""

from __future__ import annotations

import json
import re
from typing import Any

_LANG = re.compile(r"[\w-]*")

#: observation fields not worth showing to the model
HIDDEN_FIELDS = frozenset({"metadata", "done", "reward"})


def strip_code_fences(text: str) -> str:
    """``\u0060\u0060\u0060json\\n{...}\\n\u0060\u0060\u0060`` → ``{...}``; other text unchanged (stripped)."""
    # a scan, not a lazy regex: the regex was quadratic in a reply of spaces after a fence
    s = text.strip()
    if len(s) >= 6 and s.startswith("```") and s.endswith("```"):
        inner = s[3:-3]
        return inner[_LANG.match(inner).end() :].strip()  # type: ignore[union-attr]
    return s


def parse_action(text: str) -> dict[str, Any]:
    """The action a reply stands for: a JSON object (fences stripped, or the first ``{…}`` span in
    the text) is the action; anything else is ``{"message": text}`` for the server to judge."""
    body = strip_code_fences(text or "")
    start, end = body.find("{"), body.rfind("}")  # the outermost {…} span (a regex was quadratic on "{{{…")
    for candidate in (body, *([body[start : end + 1]] if 0 <= start < end else [])):
        try:
            obj = json.loads(candidate)
        except (ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
            continue
        if isinstance(obj, dict):
            return obj
    return {"message": body}


def format_observation(observation: Any) -> str:
    """A user message for an observation: its ``text``/``message``/``prompt`` field when it has one
    (plus the other visible fields as ``key: value`` lines), else compact JSON."""
    if isinstance(observation, str):
        return observation
    if not isinstance(observation, dict):
        return str(observation)
    if "tool_name" in observation and ("result" in observation or "error" in observation):
        return format_tool_result(observation)
    visible = {k: v for k, v in observation.items() if k not in HIDDEN_FIELDS and v not in (None, "", [], {})}
    if not visible and isinstance(observation.get("metadata"), dict):
        visible = {k: v for k, v in observation["metadata"].items() if v not in (None, "", [], {})}
    for key in ("text", "message", "prompt", "content"):
        if isinstance(visible.get(key), str):
            head = visible.pop(key)
            rest = "\n".join(f"{k}: {_short(v)}" for k, v in visible.items())
            return f"{head}\n{rest}" if rest else head
    return json.dumps(visible, ensure_ascii=False, sort_keys=True)


def format_tool_result(observation: dict[str, Any]) -> str:
    """An MCP ``CallToolObservation``: its text content, or ``Error: …`` when the call failed."""
    error = observation.get("error")
    if error:
        message = error.get("message") if isinstance(error, dict) else str(error)
        return f"Error: {str(message).strip().splitlines()[0] if message else 'tool call failed'}"
    result = observation.get("result")
    if isinstance(result, dict):
        texts = [c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict) and c.get("type") == "text"]
        if texts:
            return "\n".join(texts)
        if result.get("data") is not None:
            return _short(result["data"])
    return _short(result)


def _short(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
