"""Token-backed assistant messages (ms-swift 4.x): ids in place of text, decoded and checked.

ms-swift 4.6.0 (``swift/template/utils.py``: ``get_token_backed_response_ids``) lets an assistant
message's ``content`` be the exact token ids it was sampled as. These helpers turn such a message
into the text rlcore's conversation holds and say when its ids cannot be one message's tokens.
"""

from __future__ import annotations

import weakref
from typing import Any

from ..errors import ConfigError
from .. import chat_template as tk
from ..compat.swift.api import token_backed_ids

_CLOSING: "weakref.WeakKeyDictionary[Any, frozenset[int]]" = weakref.WeakKeyDictionary()


def closing_token_ids(tokenizer: Any) -> frozenset[int]:
    """Token ids that end an assistant message: the eos and the special token the chat template
    closes an assistant message with (``<|im_end|>`` in ChatML)."""
    try:
        cached = _CLOSING.get(tokenizer)
    except TypeError:
        cached = None
    if cached is not None:
        return cached
    ids: set[int] = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    try:
        closing = tk.generic_assistant_closing(tokenizer)
    except Exception:  # noqa: BLE001 - a template without one: the eos is enough
        closing = ""
    for tok_text, tid in zip(getattr(tokenizer, "all_special_tokens", []) or [], getattr(tokenizer, "all_special_ids", []) or []):
        if tok_text and closing.startswith(tok_text):
            ids.add(int(tid))
    out = frozenset(ids)
    try:
        _CLOSING[tokenizer] = out
    except TypeError:
        pass
    return out


def message_text(tokenizer: Any, ids: list[int]) -> str:
    """The text a token-backed assistant message stands for: its ids decoded, without a closing
    eos at the end (the template renders that closing itself)."""
    if ids and ids[-1] in closing_token_ids(tokenizer):
        ids = ids[:-1]
    return tk.decode(tokenizer, ids)


def closing_inside(tokenizer: Any, ids: list[int], continues: bool, where: str) -> str | None:
    """Why ``ids`` cannot be one message's tokens — a closing token before their end (or at it, when
    the message continues) — else ``None``."""
    closing = closing_token_ids(tokenizer)
    last = len(ids) if continues else len(ids) - 1
    for k, t in enumerate(ids[:max(last, 0)]):
        if t in closing:
            name = tk.decode(tokenizer, [t])
            return (
                f"{where} holds the closing token {name!r} at token {k} of {len(ids)} and the message continues after it; "
                "drop it before appending (ms-swift 4.6.0 keeps it, which trains the model to go on after its eos)"
            )
    return None


def materialize_messages(tokenizer: Any, messages: list[dict[str, Any]]) -> int:
    """Replace every token-backed assistant content in ``messages`` by its text, in place; returns how many."""
    n = 0
    for m in messages:
        if not isinstance(m, dict) or m.get("role") != "assistant":
            continue
        ids = token_backed_ids(m.get("content"))
        if ids is None:
            continue
        if tokenizer is None:
            raise ConfigError("a token-backed assistant message needs a tokenizer to be decoded; pass tokenizer=")
        m["content"] = message_text(tokenizer, ids)
        n += 1
    return n
