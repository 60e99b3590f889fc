"""``guess_number``: find a secret integer with higher/lower feedback.

Small enough for a tiny model to learn something (the range is a few numbers by default), yet
multi-turn in an essential way: the best reply depends on every earlier observation.
Reward: ``1`` for the correct guess, ``0`` otherwise; invalid replies follow the invalid-action policy.
"""

from __future__ import annotations

import random
from typing import Any

from rlcore.envs import Env
from rlcore.errors import ConfigError

from .actions import last_int
from .policy import ActionParseError, InvalidActionPolicy
from .seeding import episode_seed


class GuessNumberEnv(Env):
    name = "guess_number"

    def __init__(
        self,
        low: int = 1,
        high: int = 8,
        *,
        seed: int | None = None,
        invalid_action: str = "retry",
        invalid_penalty: float = -0.1,
        max_invalid_actions: int | None = 3,
    ) -> None:
        if int(low) >= int(high):
            raise ConfigError(f"guess_number needs low < high, got low={low} high={high}")
        self.low, self.high = int(low), int(high)
        self.seed = seed
        self.policy = InvalidActionPolicy(invalid_action, invalid_penalty, max_invalid_actions)
        self.secret: int | None = None
        self.guesses = 0

    async def reset(self, request: Any) -> tuple[str, dict[str, Any], str | None]:
        seed = episode_seed(request, self.seed)
        self.secret = random.Random(seed).randint(self.low, self.high)
        self.guesses = 0
        system = (
            f"I am thinking of a whole number from {self.low} to {self.high}. Guess it. After each guess I say "
            "whether the number is higher or lower. Reply with just your guess."
        )
        return "Make your first guess.", {"low": self.low, "high": self.high, "seed": seed}, system

    async def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        guess = last_int(action)
        if guess is None or not self.low <= guess <= self.high:
            err = ActionParseError(f"reply with a whole number from {self.low} to {self.high}")
            return self.policy.handle(self.name, action, err)
        self.policy.valid()
        self.guesses += 1
        info: dict[str, Any] = {"guess": guess, "guesses": self.guesses}
        if guess == self.secret:
            return f"Correct! The number was {guess}.", 1.0, True, {**info, "solved": True}
        hint = "higher" if self.secret > guess else "lower"  # type: ignore[operator]
        return f"{guess} is wrong. The number is {hint}.", 0.0, False, info
