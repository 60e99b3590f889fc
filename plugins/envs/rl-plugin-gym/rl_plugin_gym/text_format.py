"""How a gymnasium env is shown to a language model: the base formatter and the generic fallbacks.

A formatter owns everything textual about one game: the system message (rules, how to answer), the
action names the parser accepts, and the words for each state and each step's outcome. Per-env
formatters live in :mod:`rl_plugin_gym.toy_text`; any other env gets :class:`AnsiFormat` (its
``ansi`` render, colour highlights turned into ``[x]``) or :class:`ReprFormat` (the raw observation).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

_ANSI_SPAN = re.compile(r"\x1b\[[0-9;]*m(.*?)\x1b\[0m", re.S)
_ANSI_ANY = re.compile(r"\x1b\[[0-9;]*m")


class GameFormat:
    """Base formatter. Subclasses override what they know better; every method gets the live env."""

    #: action names in action-index order (``None``: actions are numbers)
    action_names: Sequence[str] | None = None
    #: extra words accepted for an action, e.g. ``{"STAND": "STICK"}``
    aliases: dict[str, str] = {}
    #: the render mode this formatter needs from ``gymnasium.make`` (``None``: no rendering)
    render_mode: str | None = None

    def system_message(self, env: Any, choices: str) -> str:
        title = getattr(getattr(env, "spec", None), "id", None) or type(env.unwrapped).__name__
        return (
            f"You are playing the environment {title}. Each turn you see the current state and reply "
            f"with one action: {choices}. Put the action last, or inside <answer></answer>."
        )

    def describe(self, obs: Any, env: Any) -> str:
        """The state, in words."""
        raise NotImplementedError

    def potential(self, obs: Any, env: Any) -> float | None:
        """How close ``obs`` is to the goal, for progress shaping: 0 at the goal, -1 at the farthest
        state (``None``: this game has no notion of distance, so no shaping)."""
        return None

    def outcome(self, action: str, reward: float, terminated: bool, truncated: bool, obs: Any, env: Any) -> str:
        """What the last step did, followed by the new state."""
        lines = [f"You chose {action}. Reward: {reward:g}."]
        if terminated:
            lines.append("The episode is over.")
        elif truncated:
            lines.append("Time is up: the episode is over.")
        else:
            lines.append(self.describe(obs, env))
        return "\n".join(lines)

    def step_report(self, said: str, reward: float, note: str, truncated: bool, obs: Any, env: Any) -> str:
        """A non-final step's message for games that report each step's reward: ``said (reward r).``,
        an optional ``note``, the new state, and the out-of-time line when the episode was cut."""
        end = "\nOut of time: the episode is over." if truncated else ""
        return f"{said} (reward {reward:g}).{note}\n{self.describe(obs, env)}{end}"


class AnsiFormat(GameFormat):
    """Any env with an ``ansi`` render: the text picture, highlighted cells shown as ``[x]``."""

    render_mode = "ansi"

    def describe(self, obs: Any, env: Any) -> str:
        return "Current state:\n" + ansi_to_text(str(env.render()))


class ReprFormat(GameFormat):
    """Last resort: the observation's values as text (fine for small vectors and tuples)."""

    def describe(self, obs: Any, env: Any) -> str:
        return f"Observation: {observation_text(obs)}"


def ansi_to_text(frame: str) -> str:
    """Drop terminal colours, keeping what they marked (the agent, the target) visible as ``[x]``."""
    return _ANSI_ANY.sub("", _ANSI_SPAN.sub(lambda m: f"[{m.group(1)}]", frame)).rstrip()


def observation_text(obs: Any) -> str:
    """Numbers as plain text: ``3``, ``(14, 10, 0)``, ``0.12 -0.5``."""
    if hasattr(obs, "tolist"):
        obs = obs.tolist()
    if isinstance(obs, float):
        return f"{obs:.4g}"
    if isinstance(obs, (list, tuple)):
        inner = ", ".join(observation_text(x) for x in obs)
        return f"({inner})" if isinstance(obs, tuple) else f"[{inner}]"
    if isinstance(obs, dict):
        return "{" + ", ".join(f"{k}: {observation_text(v)}" for k, v in obs.items()) + "}"
    return str(obs)
