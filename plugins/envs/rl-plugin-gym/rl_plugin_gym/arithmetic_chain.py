"""``arithmetic_chain``: keep a running total through a chain of small operations.

Each turn asks for one operation applied to the previous result ("Add 3 to it."). A correct answer
earns ``1/length``, so a perfect chain totals ``1``; a wrong one earns nothing and is corrected so
the rest of the chain stays solvable (unless ``stop_on_error``). Good for checking that multi-turn
credit assignment works: every step's reward is visible in ``step_rewards``.
"""

from __future__ import annotations

import random
from typing import Any

from rlcore.envs import Env
from rlcore.errors import ConfigError

from .actions import last_int
from .policy import ActionParseError, InvalidActionPolicy
from .seeding import episode_seed

_WORDS = {"+": "Add {n} to it.", "-": "Subtract {n} from it.", "*": "Multiply it by {n}."}


class ArithmeticChainEnv(Env):
    name = "arithmetic_chain"

    def __init__(
        self,
        length: int = 3,
        max_operand: int = 9,
        *,
        ops: str = "+-*",
        stop_on_error: bool = False,
        seed: int | None = None,
        invalid_action: str = "retry",
        invalid_penalty: float = -0.1,
        max_invalid_actions: int | None = 3,
    ) -> None:
        if int(length) < 1 or int(max_operand) < 1 or not ops or set(ops) - set(_WORDS):
            raise ConfigError(
                f"arithmetic_chain needs length >= 1, max_operand >= 1 and ops from '+-*'; got {length}, {max_operand}, {ops!r}"
            )
        self.length, self.max_operand, self.ops = int(length), int(max_operand), ops
        self.stop_on_error = stop_on_error
        self.seed = seed
        self.policy = InvalidActionPolicy(invalid_action, invalid_penalty, max_invalid_actions)
        self.steps: list[tuple[str, int]] = []
        self.value = 0
        self.index = 0

    def _question(self) -> str:
        op, n = self.steps[self.index]
        return _WORDS[op].format(n=n) + " What is the result?"

    async def reset(self, request: Any) -> tuple[str, dict[str, Any], str | None]:
        seed = episode_seed(request, self.seed)
        rng = random.Random(seed)
        self.value = rng.randint(1, self.max_operand)
        self.steps = [(rng.choice(self.ops), rng.randint(1, self.max_operand)) for _ in range(self.length)]
        self.index = 0
        system = "We compute step by step. Keep a running number and reply to each step with just the new number."
        return f"Start with {self.value}. {self._question()}", {"start": self.value, "seed": seed}, system

    def expected(self) -> int:
        op, n = self.steps[self.index]
        return self.value + n if op == "+" else self.value - n if op == "-" else self.value * n

    async def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        answer = last_int(action)
        if answer is None:
            return self.policy.handle(self.name, action, ActionParseError("reply with the resulting whole number"))
        self.policy.valid()
        want = self.expected()
        correct = answer == want
        self.value = want
        self.index += 1
        info = {"step": self.index, "correct": correct, "expected": want}
        reward = 1.0 / self.length if correct else 0.0
        verdict = "Correct." if correct else f"Wrong, it is {want}."
        if self.index >= self.length or (not correct and self.stop_on_error):
            return f"{verdict} The chain is over.", reward, True, info
        return f"{verdict} {self._question()}", reward, False, info
