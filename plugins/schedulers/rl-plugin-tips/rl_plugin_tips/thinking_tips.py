"""``thinking_tips_scheduler``: multi-round answering with a user tip after each wrong answer.

Each round is its own trajectory (one per round, all in the request's group): its prompt is the
conversation so far — earlier answers with their ``<think>`` part removed, each followed by the
tip — and its completion is that round's answer, thinking included. That is how thinking models
see history at inference (their chat templates drop old thinking), and it keeps every trained
completion short. Stops on a correct answer, a length-truncated answer, or ``max_turns`` rounds.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from rlcore.asyncutil import await_me_maybe
from rlcore.rollout import MultiTurnScheduler, ResponseChoice, apply_turn_end
from rlcore import chat_template as tk
from rlcore.types import Completion, Trajectory

from .accuracy import AccuracyFn, judge, reference_of, resolve_accuracy

DEFAULT_USER_TIP = (
    "That answer is not right. Go back over your reasoning step by step, find the mistake, and answer again."
)

_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def strip_thinking(text: str) -> str:
    """The answer part of a thinking model's message: everything after the last ``</think>``
    (templates that open ``<think>`` in the prompt leave only the closing tag), else the text with
    any ``<think>…</think>`` blocks removed."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1].lstrip()
    return _THINK.sub("", text)


class ThinkingTipsScheduler(MultiTurnScheduler):
    """Options: ``tip`` (the user message after a wrong answer), ``accuracy``, ``reference_key``,
    ``max_turns`` (rounds, default 3), ``strip_history_thinking`` (True)."""

    name = "thinking_tips_scheduler"
    default_max_turns = 3

    def __init__(
        self,
        sampler: Any = None,
        *,
        tip: str = DEFAULT_USER_TIP,
        accuracy: AccuracyFn | str | None = None,
        reference_key: str | None = None,
        strip_history_thinking: bool = True,
        **options: Any,
    ) -> None:
        super().__init__(sampler, **options)
        self.tip = tip
        self.accuracy = resolve_accuracy(accuracy)
        self.reference_key = reference_key
        self.strip_history_thinking = strip_history_thinking

    def on_turn_end(self, infer_request: Trajectory, response_choice: Completion, current_turn: int) -> dict[str, Any]:
        text = str(infer_request.messages[-1].get("content") or "")
        correct = judge(self.accuracy, text, reference_of(infer_request, self.reference_key))
        return {"infos": {"correct": correct, "round": current_turn}}

    def next_round(self, request: Trajectory, previous: Trajectory) -> Trajectory:
        """The next round's trajectory: history (old thinking removed) + the tip as the prompt."""
        answer = str(previous.messages[-1].get("content") or "")
        if self.strip_history_thinking:
            answer = strip_thinking(answer)
        n_prompt = int(previous.infos.get("prompt_messages") or len(previous.messages) - 1)
        history = copy.deepcopy(previous.messages[:n_prompt])
        history += [{"role": "assistant", "content": answer}, {"role": "user", "content": self.tip}]
        return Trajectory(
            prompt_ids=tk.encode_prompt(self._require_tokenizer(), history, self.tools),
            messages=history,
            data=dict(request.data),
            group_id=request.group_id,
            infos={"prompt_messages": len(history), "tips_request": request.uuid},
        )

    async def run(self, infer_request: Trajectory, request_config: Any = None, **kwargs: Any) -> list[Trajectory]:
        """Round after round until correct; returns every round's trajectory (the request first)."""
        rounds: list[Trajectory] = []
        traj = infer_request
        traj.infos.setdefault("prompt_messages", len(traj.messages))
        try:
            for rnd in range(1, self.max_turns + 1):
                try:
                    completion = await self.generate(traj, request_config)
                except Exception as exc:  # noqa: BLE001 - later rounds fail alone; earlier ones stand
                    if traj is infer_request:
                        raise
                    traj.fail(f"round {rnd}: {type(exc).__name__}: {exc}".splitlines()[0])
                    rounds.append(traj)
                    break
                traj.num_turns = 1
                choice = ResponseChoice(completion, self.tokenizer)
                done = apply_turn_end(traj, await await_me_maybe(self.on_turn_end(traj, choice, rnd)))
                await self.observe_turn(traj, choice, rnd)
                truncated = completion.finish_reason == "length"
                traj.status, traj.reason = ("truncated", "max_tokens reached") if truncated else ("ok", None)
                rounds.append(traj)
                if done or truncated or traj.infos.get("correct") or rnd >= self.max_turns:
                    break
                traj = self.next_round(infer_request, traj)
        finally:
            for t in rounds[1:] + ([traj] if traj not in rounds else []):
                if t is not infer_request:  # the driver releases the request's own stream
                    self.release(t)
        for t in rounds:
            t.infos["rounds"] = len(rounds)
        return rounds
