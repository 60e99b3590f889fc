"""Stop a run that can no longer mean anything, with one line saying why.

Why: a run whose environment server is down fails every trajectory; it used to "train" on
(loss 0, reward 0.000 → 0.000), print done and exit 0. A few failed trajectories are normal (a
flaky env, a timeout) and the step goes on without them; a failed share above
``failure_threshold`` for ``failure_patience`` generation steps in a row stops the run with
:class:`~rlcore.errors.RunFailedError` (the CLI exits non-zero). Checkpoints already written stay.
A run whose rewards score nothing (None or NaN for every trajectory) for ``failure_patience``
generation steps in a row stops the same way: it would train on nothing while looking fine.
(A reward that raises on every sample stops the run at once: ``rlcore.trainer.scored.check_reward_failures``.)
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from ..errors import RunFailedError


class RunHealth:
    """Counts consecutive bad generation steps; :meth:`check` raises when a count reaches ``patience``."""

    def __init__(self, threshold: float = 0.5, patience: int = 3) -> None:
        self.threshold = float(threshold)
        self.patience = int(patience)
        self.failing_steps = 0
        self.unscored_steps = 0

    def check(self, trajectories: Sequence[Any]) -> None:
        n = len(trajectories)
        if not n:
            return
        failed = [t for t in trajectories if t.status == "failed"]
        share = len(failed) / n
        scorable = [t for t in trajectories if t.status != "failed"]
        if scorable:  # every reward gave None/NaN for every trajectory: nothing to learn from
            self.unscored_steps = self.unscored_steps + 1 if all(t.reward is None for t in scorable) else 0
        if self.unscored_steps >= self.patience:
            raise RunFailedError(
                f"no reward scored any trajectory (every reward gave None or NaN) in each of the last "
                f"{self.unscored_steps} generation steps, so the run trains on nothing — check what the rewards "
                "read (rewards/<name> in metrics.jsonl, the dataset's columns) (or raise failure_patience)"
            )
        self.failing_steps = self.failing_steps + 1 if share > self.threshold else 0
        if self.failing_steps >= self.patience:
            reasons = Counter(str(t.reason or "no reason given") for t in failed)
            reason, count = reasons.most_common(1)[0]
            raise RunFailedError(
                f"{share:.0%} of trajectories failed (over failure_threshold={self.threshold:g}) in each of the last "
                f"{self.failing_steps} generation steps; most common reason ({count}/{len(failed)}): {reason[:300]} "
                "— fix the cause (or raise failure_threshold / failure_patience)"
            )
