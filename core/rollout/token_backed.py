"""Token-backed assistant messages: ids in place of text, decoded and checked.

An assistant message's ``content`` may be the exact token ids it was sampled as (a list of ints, or
a dict holding them under ``token_ids``/``input_ids``; ms-swift 4.6.0's ``swift/template/utils.py``
accepts the same shapes). The token stream checks such a message against the tokens it holds;
these helpers turn it into the text rlcore's conversation holds and say when its ids cannot be one
message's tokens.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

from ..errors import ConfigError
from .. import chat_template as tk

_CLOSING: "weakref.WeakKeyDictionary[Any, frozenset[int]]" = weakref.WeakKeyDictionary()


def token_backed_ids(content: Any) -> list[int] | None:
    """The token ids a token-backed assistant ``content`` stands for, else ``None`` (plain text,
    multimodal parts): a list of ints, or a dict holding one under ``token_ids`` (else ``input_ids``)."""
    held = content
    if isinstance(content, dict):
        held = content["token_ids"] if "token_ids" in content else content.get("input_ids")
    if isinstance(held, list) and all(_is_token_id(t) for t in held):
        return [int(t) for t in held]
    return None


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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


def assistant_ids(messages: list[dict[str, Any]]) -> Any:
    """Each assistant message with the token ids its content stands for (``None`` for text)."""
    return ((m, token_backed_ids(m.get("content"))) for m in messages if m.get("role") == "assistant")


def snapshot_and_materialize(tokenizer: Any, messages: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Any]]:
    """Decode token-backed assistant messages in place for hooks that read text; returns what
    :func:`restore_snapshots` puts back (nothing when no message is token-backed)."""
    backed = [(m, ids) for m, ids in assistant_ids(messages) if ids is not None]
    if not backed:
        return []
    if tokenizer is None:
        raise ConfigError("a token-backed assistant message needs a tokenizer to be decoded; pass tokenizer=")
    snapshots = [(m, copy.deepcopy(m["content"])) for m, _ in backed]
    for m, ids in backed:
        m["content"] = message_text(tokenizer, ids)
    return snapshots


def restore_snapshots(snapshots: list[tuple[dict[str, Any], Any]]) -> None:
    """Put back the token-backed contents :func:`snapshot_and_materialize` decoded."""
    for m, content in snapshots:
        m["content"] = content
