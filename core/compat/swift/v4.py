"""ms-swift 4.x's scheduler helpers (``swift/rollout/multi_turn.py``, 4.6.0), kept token-exact.

ms-swift 4.x's ``MultiTurnScheduler.run`` keeps each assistant message, once answered, as the exact
token ids it was sampled as (*token-backed* content: a list of ids in place of text), and gives
schedulers helpers to build, decode and restore such messages. A 4.x scheduler body calls them —
a ``step`` built on ``prepare_response_continuation``, a ``run`` copied from 4.x's base class — so
rlcore has them, under ms-swift's names and with ms-swift's meaning, written for rlcore.

rlcore's token stream (:mod:`rlcore.rollout.stream`) already holds every message's exact tokens, so
a token-backed message is a claim the stream checks, not a second source of truth: ids equal to
what the stream holds change nothing; ids for the open (last) assistant message that differ replace
its tokens (the part that matches what was sampled keeps loss mask 1 and its logprobs; the rest is
the scheduler's, mask 0); ids for an earlier message must equal its tokens. What rlcore refuses
where ms-swift 4.6.0 goes on — the trajectory fails with the reason — is the template's closing
token (``<|im_end|>``, the eos) inside a message that continues after it: ms-swift's
``MathTipsScheduler.step`` keeps it when the answer has no ``<answer>``/``</think>``, and its base
``run`` re-sends a continued message with the sampled eos still in it. Trained, that teaches the
model to go on talking after it said it was done.

Differences from 4.6.0, each because rlcore's token stream makes it so:

* ``get_response_token_data`` adds no response prefix: rlcore's generation prompt is the chat
  template's own (Qwen3's empty ``<think></think>`` included), so the prefix is already prompt or
  observation tokens and never part of a completion.
* ``prepare_response_continuation`` leaves out the closing eos the model sampled (and its logprob):
  the helper exists to append text after the sampled tokens, and the eos cannot stay inside the
  message (see above). ms-swift 4.6.0 returns it.
* decoded (materialised) text leaves out a closing eos at the end, as rlcore's message text always
  does (``TokenStream.content_of``); ms-swift decodes it into the text.
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError
from ...rollout.stream import MessagesEditError
from ...rollout.token_backed import (
    closing_inside,
    closing_token_ids,
    message_text,
    restore_snapshots,
    snapshot_and_materialize,
    token_backed_ids,
)
from .api import extract_logprobs


class SwiftHelpers:
    """ms-swift 4.6.0's ``RolloutScheduler`` helper methods; mixed into ms-swift's base classes
    (:class:`rlcore.compat.swift.adapter.RolloutScheduler`).

    Needs ``self.tokenizer`` (and ``self.infer_engine`` for :attr:`engine`)."""

    tokenizer: Any

    @property
    def engine(self) -> Any:
        """ms-swift 4.x's alias of ``self.infer_engine``."""
        return self.infer_engine  # type: ignore[attr-defined]

    def get_response_token_data(
        self,
        infer_request: Any,
        response_choice: Any,
        is_continuation: bool = False,
        response_token_ids: list[int] | None = None,
        response_loss_mask: list[int] | None = None,
    ) -> tuple[list[int], list[int]]:
        """The exact ids and loss mask of one assistant segment: the sampled ids (mask 1), or the
        scheduler's own ids and mask, checked to agree. No response prefix (see the module doc)."""
        ids = list(response_choice.token_ids or []) if response_token_ids is None else [int(t) for t in response_token_ids]
        if response_loss_mask is None:
            return ids, [1] * len(ids)
        mask = [int(m) for m in response_loss_mask]
        if len(mask) != len(ids):
            raise ConfigError(f"response_loss_mask has {len(mask)} values for {len(ids)} response_token_ids; they must match")
        if any(m not in (0, 1) for m in mask):
            raise ConfigError(f"response_loss_mask values must be 0 or 1, got {sorted(set(mask) - {0, 1})}")
        return ids, mask

    def prepare_response_continuation(self, response_choice: Any) -> tuple[list[int], list[int], list[float]]:
        """The sampled ids, an all-1 mask and their logprobs, ready for text appended after them:
        without the closing eos the model sampled (ms-swift 4.6.0 keeps it; see the module doc)."""
        ids = list(response_choice.token_ids or [])
        lps = extract_logprobs(response_choice)
        if lps and len(lps) != len(ids):
            raise ConfigError(f"the response has {len(lps)} logprobs for {len(ids)} sampled token ids; they must match")
        tok = self.tokenizer
        if ids and tok is not None and ids[-1] in closing_token_ids(tok) and getattr(response_choice, "finish_reason", None) != "length":
            ids = ids[:-1]
            lps = lps[: len(ids)]
        return ids, [1] * len(ids), lps

    def set_assistant_message_token_ids(self, infer_request: Any, token_ids: list[int]) -> None:
        """Make the latest assistant message token-backed: ``token_ids`` are its exact tokens
        (checked by the token stream before the next generation)."""
        latest = next((m for m in reversed(infer_request.messages) if m.get("role") == "assistant"), None)
        if latest is not None:
            latest["content"] = [int(t) for t in token_ids]

    def snapshot_and_materialize_assistant_messages(self, infer_request: Any) -> list[tuple[dict[str, Any], Any]]:
        """Decode token-backed assistant messages in place for text-reading hooks; returns what
        :meth:`restore_assistant_message_snapshots` puts back."""
        return snapshot_and_materialize(self.tokenizer, infer_request.messages)

    @staticmethod
    def restore_assistant_message_snapshots(snapshots: list[tuple[dict[str, Any], Any]]) -> None:
        """Put back the token-backed contents :meth:`snapshot_and_materialize_assistant_messages` decoded."""
        restore_snapshots(snapshots)

    def append_assistant_completion(self, infer_request: Any, completion: str) -> bool:
        """Add ``completion`` as a new assistant message, or append it to a trailing assistant
        message (decoding it first when token-backed). Returns whether it was a continuation."""
        msgs = infer_request.messages
        if not (msgs and msgs[-1].get("role") == "assistant"):
            msgs.append({"role": "assistant", "content": completion})
            return False
        last = msgs[-1]
        ids = token_backed_ids(last.get("content"))
        text = str(last.get("content") or "") if ids is None else self._continuable_text(ids)
        last["content"] = text + completion
        return True

    def _continuable_text(self, ids: list[int]) -> str:
        """The text of a token-backed message the model goes on writing: refused when a closing
        token sits inside it or at its end (it would be trained mid-message)."""
        tok = self._decoding_tokenizer()
        problem = closing_inside(tok, ids, True, "the continued assistant message")
        if problem:
            raise MessagesEditError(problem)
        return message_text(tok, ids)

    def _decoding_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ConfigError("a token-backed assistant message needs a tokenizer to be decoded; pass tokenizer=")
        return self.tokenizer

