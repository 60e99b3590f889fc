"""Environments this package serves itself: small, multi-turn, rewarded OpenEnv games.

They exist so the quickstart, the tests and the benchmark talk to a *real* OpenEnv server (typed
Action/Observation, ``create_app``, the ``/ws`` session endpoint) without downloading anything.
``guess_number``: the model guesses a hidden integer and is told "higher"/"lower"; a correct guess
ends the episode with reward 1.0. Its action accepts either ``{"guess": 42}`` or free text
``{"message": "I think 42"}`` (the first integer in the text counts), so both JSON and plain-text
model output are valid actions, while ``{"guess": "abc"}`` is a real validation error.
``reset(reply="number")`` asks for a bare number instead of JSON (the embedded default does, so a
turn can end at the first whitespace).
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
import uuid
from typing import Any, Callable, Optional

from pydantic import Field

from ._imports import without_gradio

with without_gradio():
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation

from .game_state import GuessState


class GuessAction(Action):
    """One guess: a number, or text containing one (the first integer found is the guess)."""

    guess: Optional[int] = Field(default=None, description="the guessed integer")
    message: Optional[str] = Field(default=None, description="free text; its first integer is the guess")


class GuessObservation(Observation):
    """What the player sees: the instruction or the feedback on the last guess."""

    text: str = Field(default="", description="instruction or feedback shown to the player")
    low: int = Field(default=1, description="smallest possible number")
    high: int = Field(default=100, description="largest possible number")
    attempts_left: int = Field(default=0, description="guesses remaining")


_INT = re.compile(r"-?\d+")

#: how the first observation asks for a guess (``reset(reply=...)``)
REPLY_FORMATS = {
    "json": 'Reply with JSON like {{"guess": {example}}}.',
    "number": "Reply with just your guess, a whole number like {example}.",
}


class GuessNumberEnvironment(Environment[GuessAction, GuessObservation, GuessState]):
    """Guess a hidden integer in ``[low, high]`` within ``max_attempts``; feedback says higher/lower.

    Reward: 1.0 for the winning guess, 0.0 otherwise. With ``reset(shaped=True)`` the reward is dense:
    a wrong guess inside the range earns ``0.05`` for being a valid guess plus ``0.05 × closeness``
    (1 − distance / range width) — and the closeness part only when the guess is closer than every
    earlier one, so repeating a good guess earns little and using the higher/lower feedback pays.
    With fewer than 10 guesses an episode's shaped return stays below what one win gives. ``step_delay`` (seconds, awaited,
    not slept) simulates a slow environment for the overlap benchmark without tying up server threads.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True
    #: OpenEnv otherwise starts a new worker thread per session just to construct (and later close)
    #: the environment: 64 sessions opening at once = 64 thread starts and shutdowns on the server's
    #: critical path. Construction and close are cheap here and reset/step run on the event loop
    #: (``*_async`` below), so one shared worker serves every session.
    REQUIRES_SINGLE_THREAD_EXECUTOR = True

    #: environments alive on this server process (a session holds one): lets tests see leaks
    live = 0
    _live_lock = threading.Lock()

    def __init__(self, step_delay: float = 0.0) -> None:
        super().__init__()
        self.step_delay = float(step_delay)
        self._state = GuessState(episode_id=str(uuid.uuid4()))
        self._closed = False
        with GuessNumberEnvironment._live_lock:
            GuessNumberEnvironment.live += 1

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        low: int = 1,
        high: int = 100,
        max_attempts: int = 8,
        target: Optional[int] = None,
        shaped: bool = False,
        reply: str = "json",
        **kwargs: Any,
    ) -> GuessObservation:
        if high < low:
            raise ValueError(f"high ({high}) must be >= low ({low})")
        if reply not in REPLY_FORMATS:
            raise ValueError(f"reply must be one of {', '.join(REPLY_FORMATS)}, got {reply!r}")
        rng = random.Random(seed)
        chosen = int(target) if target is not None else rng.randint(low, high)
        self._state = GuessState(
            episode_id=episode_id or str(uuid.uuid4()),
            step_count=0,
            target=chosen,
            low=low,
            high=high,
            max_attempts=max_attempts,
            shaped=bool(shaped),
        )
        return GuessObservation(
            text=(
                f"I am thinking of a number between {low} and {high}. You have {max_attempts} guesses. "
                + REPLY_FORMATS[reply].format(example=(low + high) // 2)
            ),
            low=low,
            high=high,
            attempts_left=max_attempts,
            reward=0.0,
            done=False,
        )

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        st = self._state
        if st.won or st.step_count >= st.max_attempts:
            raise RuntimeError("episode is over; call reset first")
        st.step_count += 1
        left = st.max_attempts - st.step_count
        guess = action.guess
        reward = 0.0
        if guess is None and action.message is not None:
            found = _INT.search(action.message)
            guess = int(found.group()) if found else None
        if guess is None:
            text = "I could not find a number in your reply."
        elif guess == st.target:
            st.won = True
            return GuessObservation(
                text=f"Correct! The number was {st.target}.", low=st.low, high=st.high,
                attempts_left=left, reward=1.0, done=True,
            )
        elif not st.low <= guess <= st.high:
            text = f"{guess} is outside {st.low}..{st.high}."
        else:
            text = f"{guess} is too {'low' if guess < st.target else 'high'}."
            if st.shaped:  # dense signal: a valid guess, and a guess closer than any before it
                distance = abs(guess - st.target)
                closer = st.best is None or distance < st.best
                st.best = distance if closer else st.best
                reward = 0.05 + (0.05 * (1.0 - distance / max(1, st.high - st.low)) if closer else 0.0)
        done = left <= 0
        if done:
            text += f" No guesses left; the number was {st.target}."
        return GuessObservation(
            text=text, low=st.low, high=st.high, attempts_left=left, reward=reward, done=done,
        )

    async def reset_async(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        # cheap and non-blocking: run on the server's loop instead of a worker thread per session
        return self.reset(seed=seed, episode_id=episode_id, **kwargs)

    async def step_async(
        self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any
    ) -> GuessObservation:
        if self.step_delay > 0:
            await asyncio.sleep(self.step_delay)
        return self.step(action, timeout_s=timeout_s, **kwargs)

    @property
    def state(self) -> GuessState:
        return self._state

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with GuessNumberEnvironment._live_lock:
                GuessNumberEnvironment.live -= 1


def _mcp_game() -> tuple[Callable[..., Environment], type[Action], type[Observation]]:
    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

    from .games_mcp import GuessNumberMCPEnvironment

    return GuessNumberMCPEnvironment, CallToolAction, CallToolObservation


#: servable environments: name -> (factory taking server options, action class, observation class),
#: or a function returning that triple (imported only when that environment is served)
GAMES: dict[str, Any] = {
    "guess_number": (GuessNumberEnvironment, GuessAction, GuessObservation),
    "guess_number_mcp": _mcp_game,
}


def game(name: str) -> tuple[Callable[..., Environment], type[Action], type[Observation]]:
    entry = GAMES[name]
    return entry() if callable(entry) else entry
