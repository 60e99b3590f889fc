"""``math_tip_trick``: when the answer is wrong, cut it before its conclusion and make the model
continue its own message after "But wait... It seems I made a mistake,".

Why token-exact: the kept part of the first attempt is trained (loss_mask 1) with the logprobs the
sampler reported for it, so the kept tokens must be exactly the sampled ones — the cut is found
in token space (:mod:`rl_plugin_tips.truncate`) and handed to the engine as
``response_token_ids``; nothing sampled is re-tokenised. The tip itself (and any bridge text up to
the marker) is scheduler text: loss_mask 0, no logprobs. One tip per trajectory.
"""

from __future__ import annotations

from typing import Any, Sequence

from rlcore.rollout import MultiTurnScheduler
from rlcore import chat_template as tk
from rlcore.types import Completion, Trajectory

from .accuracy import AccuracyFn, judge, reference_of, resolve_accuracy
from .truncate import cut_before_marker

DEFAULT_TIP = "But wait... It seems I made a mistake,"
#: the completion is cut before the first of these (its conclusion), so the model re-thinks
DEFAULT_MARKERS = ("</think>", "<answer>")


class MathTipTrick(MultiTurnScheduler):
    """Options: ``tip`` (the text appended), ``markers`` (cut before the first of these),
    ``accuracy`` (function ``(text, reference) -> bool`` or ``"module:function"``; default
    rl-plugin-math's), ``reference_key`` (dataset column; default ``solution`` then ``answer``),
    ``max_turns`` (2: the first attempt and one continuation)."""

    name = "math_tip_trick"
    default_max_turns = 2

    def __init__(
        self,
        sampler: Any = None,
        *,
        tip: str = DEFAULT_TIP,
        markers: Sequence[str] = DEFAULT_MARKERS,
        accuracy: AccuracyFn | str | None = None,
        reference_key: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(sampler, **options)
        self.tip = tip
        self.markers = tuple(markers)
        self.accuracy = resolve_accuracy(accuracy)
        self.reference_key = reference_key

    def on_turn_end(self, infer_request: Trajectory, response_choice: Completion, current_turn: int) -> dict[str, Any]:
        text = str(infer_request.messages[-1].get("content") or "") if infer_request.messages else response_choice.text
        correct = judge(self.accuracy, text, reference_of(infer_request, self.reference_key))
        infos: dict[str, Any] = {"correct": correct}
        if current_turn == 1:
            infos["correct_before_tip"] = correct
        return {"infos": infos}

    def check_finished(self, infer_request: Trajectory, response_choice: Completion, current_turn: int) -> bool:
        if response_choice.finish_reason == "length" or current_turn >= self.max_turns:
            return True
        return bool(infer_request.infos.get("correct")) or int(infer_request.infos.get("tips", 0)) >= 1

    def step(self, infer_request: Trajectory, response_choice: Completion, current_turn: int) -> dict[str, Any]:
        tok = self._require_tokenizer()
        st = self.stream(infer_request)
        turns = infer_request.turns[st.gen_start :]
        ids = [t for turn in turns for t in turn.token_ids]
        lps = [lp for turn in turns for lp in turn.logprobs]
        mask = [m for turn in turns for m in turn.loss_mask]
        stops = set(getattr(tok, "all_special_ids", []) or [])
        if self.sampling_params is not None:
            stops.update(self.sampling_params.stop_token_ids)
        if ids and ids[-1] in stops and response_choice.finish_reason == "stop":
            # the closing eos / stop token: the message goes on, so it must go
            ids, lps, mask = ids[:-1], lps[:-1], mask[:-1]
        cut = cut_before_marker(tok, ids, lps, self.markers)
        k = len(cut.kept_ids)
        tip_ids = tk.encode_text(tok, cut.bridge + self.tip)
        new_ids = cut.kept_ids + tip_ids
        infer_request.messages[-1]["content"] = tk.decode(tok, new_ids)
        infer_request.infos["tips"] = int(infer_request.infos.get("tips", 0)) + 1
        infer_request.infos["tip_cut_tokens"] = len(ids) - k
        return {
            "infer_request": infer_request,
            "response_token_ids": new_ids,
            "response_loss_mask": mask[:k] + [0] * len(tip_ids),
            "rollout_logprobs": list(cut.kept_logprobs) + [None] * len(tip_ids),
        }
