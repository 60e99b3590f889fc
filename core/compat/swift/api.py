"""ms-swift's rollout data shapes, so a scheduler written against ms-swift runs with import changes.

Reproduces the shapes of ms-swift 3.12.6 (``swift/llm/infer/protocol.py``: ``RolloutOutput``,
``ChatCompletionResponseChoice``; ``swift/plugin/multi_turn.py``:
``MultiTurnScheduler._extract_logprobs_from_choice``; ``swift/llm/utils.py``: ``Messages``) and of
ms-swift 4.6.0, which moved them (``swift/infer_engine/protocol.py``, ``swift/template``,
``swift/rollout/agent_loop.py``: ``extract_logprobs_from_choice``, ``invoke_async_hook``) and added
*token-backed* assistant messages (``swift/template/utils.py``: ``get_token_backed_response_ids`` — an
assistant ``content`` that is a list of token ids, or a dict holding ``token_ids``/``input_ids``,
stands for exactly those tokens). Written from reading that source; no code copied.

``RolloutOutput`` (what an overridden ``run`` may return), ``ResponseChoice`` (what the scheduler's
hooks get for a sampled turn), ``as_sampling_params`` and token-backed ids are rlcore's own, in
ms-swift's shapes (:mod:`rlcore.rollout.assemble`, :mod:`rlcore.rollout.scheduler`,
:mod:`rlcore.rollout.token_backed`), re-exported here.

Semantics that matter for training (and that rlcore enforces):

* ``RolloutOutput.response_token_ids`` / ``response_loss_mask`` / ``rollout_logprobs`` are *per
  assistant round*: round ``k`` of ``K`` belongs to the ``k``-th of the last ``K`` assistant messages
  of ``messages`` (ms-swift's trainer replaces assistant contents back to front). A flat list is
  one round. ``rollout_logprobs`` hold one value per loss-mask-1 token (or per token).
* ``response_choice.logprobs`` is ``{"content": [{"token": str, "logprob": float, ...}]}``.
"""

from __future__ import annotations

from typing import Any

import asyncio

import attrs

# rlcore's own, here under ms-swift's names (the shapes are ms-swift's)
from ...rollout.assemble import RolloutOutput  # noqa: F401
from ...rollout.scheduler import ResponseChoice, as_sampling_params  # noqa: F401
from ...rollout.token_backed import token_backed_ids

#: ms-swift's ``Messages``: a list of ``{"role": ..., "content": ...}`` dicts
Messages = list[dict[str, Any]]


def extract_logprobs(response_choice: Any) -> list[float]:
    """ms-swift's ``_extract_logprobs_from_choice``: the per-token logprobs, ``[]`` when absent."""
    lps = getattr(response_choice, "logprobs", None)
    if lps is None:
        return []
    if isinstance(lps, dict):
        return [float(item["logprob"]) for item in lps.get("content") or []]
    return [float(lp) for lp in lps if lp is not None] if all(lp is not None for lp in lps) else []


@attrs.define
class ChatCompletionResponse:
    """What ``infer_engine.infer_async`` returns: ``.choices[0]`` is a :class:`ResponseChoice`."""

    choices: list[ResponseChoice]
    prompt_token_ids: list[int] | None = None
    model: str = "rlcore"
    prompt_logprobs: list[Any] | None = None  # ms-swift 4.x's field; rlcore's samplers return none


def extract_logprobs_from_choice(response_choice: Any) -> list[float]:
    """ms-swift 4.x's module-level name (``swift.rollout.extract_logprobs_from_choice``)."""
    return extract_logprobs(response_choice)


def invoke_async_hook(coro: Any) -> Any:
    """ms-swift 4.x's ``invoke_async_hook``: drive a coroutine to its result from sync code (a fresh
    event loop; calling it while a loop runs in this thread is an error, as in ms-swift)."""
    return asyncio.run(coro) if asyncio.iscoroutine(coro) else coro


def remove_response(messages: Messages) -> str | None:
    """ms-swift's ``swift.utils.remove_response``: pop a trailing assistant message, return its content."""
    if messages and messages[-1].get("role") == "assistant":
        return messages.pop().get("content")
    return None


#: ms-swift 4.6.0's name for :func:`token_backed_ids` (``swift.template.utils``)
get_token_backed_response_ids = token_backed_ids
