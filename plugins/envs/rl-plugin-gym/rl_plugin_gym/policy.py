"""What happens when the model's reply is not a valid action: one policy shared by every env here.

A tiny model mostly babbles, so "invalid action" is the common case early in training, not an edge
case. Two policies, chosen per env with ``invalid_action``:

* ``"retry"`` (default): the step costs ``invalid_penalty`` (a step reward, so it counts in the
  cumulative env reward), the env state does not change, and the next observation tells the model
  what was wrong and what a valid reply looks like. After ``max_invalid_actions`` invalid replies in
  a row the episode ends (``info["ended"] = "invalid_actions"``).
* ``"fail"``: the trajectory fails at once with :class:`InvalidActionError` as its reason.
"""

from __future__ import annotations

from typing import Any

import attrs

from rlcore.errors import ConfigError, EnvError

POLICIES = ("retry", "fail")


class InvalidActionError(EnvError):
    """The model's reply could not be turned into an action and the env's policy is ``"fail"``."""


class ActionParseError(ValueError):
    """Raised by action parsers with a message meant for the model ("no move found; reply with …")."""


@attrs.define
class InvalidActionPolicy:
    """Turns an :class:`ActionParseError` into a retry observation or a trajectory failure."""

    mode: str = "retry"
    penalty: float = -0.1
    max_consecutive: int | None = 3
    consecutive: int = 0
    total: int = 0

    def __attrs_post_init__(self) -> None:
        if self.mode not in POLICIES:
            raise ConfigError(f"invalid_action={self.mode!r} is not a policy; use one of: {', '.join(POLICIES)}")

    def valid(self) -> None:
        """A valid action was taken: the run of invalid ones is over."""
        self.consecutive = 0

    def handle(self, env_name: str, action: str, error: ActionParseError) -> tuple[str, float, bool, dict[str, Any]]:
        """The ``(observation, reward, done, info)`` of an invalid step, or raise under ``"fail"``."""
        self.consecutive += 1
        self.total += 1
        shown = action.strip().replace("\n", " ")
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        if self.mode == "fail":
            raise InvalidActionError(f"invalid action {shown!r} in {env_name}: {error}")
        info: dict[str, Any] = {"invalid_action": True, "invalid_actions": self.total, "error": str(error)}
        if self.max_consecutive is not None and self.consecutive >= self.max_consecutive:
            info["ended"] = "invalid_actions"
            obs = f"That is not a valid action ({error}). Too many invalid actions in a row: the episode is over."
            return obs, float(self.penalty), True, info
        return f"That is not a valid action: {error}. Try again.", float(self.penalty), False, info
