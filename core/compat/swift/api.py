"""ms-swift's rollout data shapes, so a scheduler written against ms-swift runs with import changes.

Reproduces the shapes of ms-swift 3.12.6 (``swift/llm/infer/protocol.py``: ``RolloutOutput``,
``ChatCompletionResponseChoice``; ``swift/plugin/multi_turn.py``:
``MultiTurnScheduler._extract_logprobs_from_choice``; ``swift/llm/utils.py``: ``Messages``) and of
ms-swift 4.6.0, which moved them (``swift/infer_engine/protocol.py``, ``swift/template``,
``swift/rollout/agent_loop.py``: ``extract_logprobs_from_choice``, ``invoke_async_hook``) and added
*token-backed* assistant messages (``swift/template/utils.py``: ``get_token_backed_response_ids`` — an
assistant ``content`` that is a list of token ids, or a dict holding ``token_ids``/``input_ids``,
stands for exactly those tokens). Written from reading that source; no code copied.

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

from ...types import ChatMessage, Completion, SamplingParams

#: ms-swift's ``Messages``: a list of ``{"role": ..., "content": ...}`` dicts
Messages = list[dict[str, Any]]


def _rounds(value: Any) -> list[list[Any]]:
    """ms-swift's ``_wrap_flat_list``: a flat list of numbers is one round."""
    if value is None:
        return []
    items = list(value)
    if items and not isinstance(items[0], (list, tuple)):
        return [items]
    return [list(r) for r in items]


@attrs.define
class RolloutOutput:
    """What an overridden ``run`` returns (one per output trajectory; a list for several).

    ``messages`` is the final conversation, ending with the last assistant message; when omitted
    the response's text is appended to the request's messages.
    """

    response: Any = None
    messages: Messages | None = None
    response_token_ids: list[list[int]] = attrs.field(factory=list, converter=_rounds)
    response_loss_mask: list[list[int]] = attrs.field(factory=list, converter=_rounds)
    rollout_infos: dict[str, Any] = attrs.field(factory=dict)
    rollout_logprobs: list[list[float]] = attrs.field(factory=list, converter=_rounds)
    #: ms-swift 4.x's field (logprobs of the prompt tokens); accepted, not used for training
    prompt_logprobs: list[Any] | None = None


@attrs.define
class ResponseChoice:
    """ms-swift's ``ChatCompletionResponseChoice`` view of one sampled :class:`Completion`.

    ``logprobs`` has ms-swift's (OpenAI's) shape; the flat list is ``completion.logprobs``. Other
    attributes (``text``, ``meta`` …) are the completion's.
    """

    completion: Completion
    tokenizer: Any = None
    index: int = 0

    @property
    def message(self) -> ChatMessage:
        return ChatMessage(role="assistant", content=self.completion.text)

    @property
    def finish_reason(self) -> str:
        return self.completion.finish_reason

    @property
    def token_ids(self) -> list[int]:
        return self.completion.token_ids

    @property
    def routed_experts(self) -> Any:
        """ms-swift 4.x's MoE routing record of the sample; rlcore's samplers record none (None)."""
        return self.completion.meta.get("routed_experts")

    @property
    def logprobs(self) -> dict[str, list[dict[str, Any]]] | None:
        lps = self.completion.logprobs
        if lps is None:
            return None
        ids = self.completion.token_ids
        toks = [self._token(t) for t in ids]
        return {"content": [{"token": s, "token_id": t, "logprob": lp} for s, t, lp in zip(toks, ids, lps)]}

    def _token(self, token_id: int) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.convert_ids_to_tokens(int(token_id)) or ""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.completion, name)


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


def as_sampling_params(request_config: Any, default: SamplingParams | None) -> SamplingParams | None:
    """Accept rlcore's ``SamplingParams``, ms-swift's ``RequestConfig``-like object or a dict."""
    if request_config is None or isinstance(request_config, SamplingParams):
        return request_config or default
    get = request_config.get if isinstance(request_config, dict) else (lambda k, d=None: getattr(request_config, k, d))
    base = default or SamplingParams()
    changes: dict[str, Any] = {}
    for name in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty"):
        v = get(name, None)
        if v is not None:
            changes[name] = v
    stop = get("stop", None)
    if stop:
        changes["stop"] = list(stop)
    return base.replace(**changes)


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


def token_backed_ids(content: Any) -> list[int] | None:
    """The token ids a token-backed assistant ``content`` stands for, else ``None`` (plain text,
    multimodal parts). Two shapes mean ids (ms-swift 4.6.0 accepts the same): a list of ints, or a
    dict holding one under ``token_ids`` (else ``input_ids``)."""
    held = content
    if isinstance(content, dict):
        held = content["token_ids"] if "token_ids" in content else content.get("input_ids")
    if isinstance(held, list) and all(_is_token_id(t) for t in held):
        return [int(t) for t in held]
    return None


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: ms-swift 4.6.0's name for :func:`token_backed_ids` (``swift.template.utils``)
get_token_backed_response_ids = token_backed_ids
