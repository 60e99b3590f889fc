"""``guess_number_mcp``: the guessing game as an MCP environment (OpenEnv's ``MCPEnvironment``).

Its actions are MCP tool calls (``list_tools`` / ``call_tool``), the shape of OpenEnv's tool-using
environments; it exists to exercise ``openenv_tool_scheduler``'s MCP path against a real server.
Tools: ``guess(number)`` answers higher/lower; the winning call's observation has reward 1.0 and
``done``. Imported only when served (fastmcp is heavy).
"""

from __future__ import annotations

import random
from typing import Any, Optional

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation

from .game_state import GuessState


class GuessNumberMCPEnvironment(MCPEnvironment):
    """Guess a hidden integer through the MCP tool ``guess(number)``; ``hint()`` restates the range."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, step_delay: float = 0.0) -> None:
        mcp = FastMCP("guess_number")
        self._game = GuessState()

        @mcp.tool()
        def guess(number: int) -> str:
            """Guess the hidden number; the answer says whether it is higher or lower."""
            g = self._game
            g.step_count += 1
            if number == g.target:
                g.won = True
                return f"Correct! The number was {g.target}."
            left = g.max_attempts - g.step_count
            return f"{number} is too {'low' if number < g.target else 'high'}. {left} guesses left."

        @mcp.tool()
        def hint() -> str:
            """Restate the range of the hidden number."""
            return f"The number is between {self._game.low} and {self._game.high}."

        super().__init__(mcp)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, low: int = 1, high: int = 100,
              max_attempts: int = 8, target: Optional[int] = None, **kwargs: Any) -> Observation:
        chosen = int(target) if target is not None else random.Random(seed).randint(low, high)
        self._game = GuessState(episode_id=episode_id, target=chosen, low=low, high=high, max_attempts=max_attempts)
        return Observation(
            done=False, reward=0.0,
            metadata={"text": f"I am thinking of a number between {low} and {high}. Use the guess tool; "
                              f"you have {max_attempts} guesses."},
        )

    async def step_async(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        obs = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction) and isinstance(obs, CallToolObservation):
            g = self._game
            obs.reward = 1.0 if g.won else 0.0
            obs.done = g.won or g.step_count >= g.max_attempts
        return obs

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": f"unsupported action {type(action).__name__}"})

    @property
    def state(self) -> GuessState:
        return self._game
