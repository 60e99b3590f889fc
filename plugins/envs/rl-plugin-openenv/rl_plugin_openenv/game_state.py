"""The guess-number game's server-side state, shared by both servings of the game: the plain
OpenEnv environment (:mod:`.games`) and the MCP one (:mod:`.games_mcp`). It lives apart so that
:mod:`.games` (which names the MCP variant lazily) and :mod:`.games_mcp` import it one way."""

from __future__ import annotations

from typing import Optional

from ._imports import without_gradio

with without_gradio():
    from openenv.core.env_server.types import State


class GuessState(State):
    """Server-side episode state (the target is only visible here, never in observations)."""

    target: int = 0
    low: int = 1
    high: int = 100
    max_attempts: int = 8
    won: bool = False
    shaped: bool = False
    best: Optional[int] = None
