"""Prompt samplers (component kind ``prompt_sampler``): which dataset rows the next generation
batch rolls out.

A prompt sampler is built as ``factory(cursor=PromptCursor, **options)`` (the seeded walk over the
rows that a checkpoint saves) and offers:

* ``take(k) -> list[int]``: the row indices of the next ``k`` prompts;
* ``observe(outcomes)``: after scoring, ``(row index, [reward of each completion])`` per group;
* ``metrics() -> dict[str, float]`` for the step's logs, ``state_dict()`` / ``load_state_dict()``
  for checkpoints (a resumed run draws exactly the prompts the uninterrupted one would).

Built in: ``uniform`` (the cursor as it is: every row once per epoch, in the seeded order) and
``difficulty``: a prompt whose last ``window`` groups all scored one same reward (every completion
solved it, or none did) gives no learning signal; ``mode="skip"`` passes it over,
``mode="downweight"`` keeps it with probability ``min_weight``. When every prompt is settled the
sampler draws them anyway rather than stall the run (after passing over two epochs' worth of draws
in a row; ``prompt_sampler/exhausted`` counts those).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from ..errors import ConfigError
from ..hookspecs import hookimpl
from ..data.cursor import PromptCursor

__all__ = ["DifficultyPromptSampler", "UniformPromptSampler", "make_prompt_sampler"]


class UniformPromptSampler:
    """Today's order: the cursor's seeded walk, epoch after epoch (no state of its own)."""

    def __init__(self, cursor: PromptCursor) -> None:
        self.cursor = cursor

    def take(self, k: int) -> list[int]:
        return self.cursor.take(k)

    def observe(self, outcomes: Sequence[tuple[int, Sequence[float | None]]]) -> None:
        """Uniform sampling ignores how prompts scored."""

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore: the cursor's position is saved with the run."""


class DifficultyPromptSampler(UniformPromptSampler):
    """Skip (or keep with probability ``min_weight``) prompts whose last ``window`` groups all got
    one same reward. Its per-prompt history and draw count are saved in checkpoints."""

    def __init__(self, cursor: PromptCursor, window: int = 2, mode: str = "skip", min_weight: float = 0.1) -> None:
        super().__init__(cursor)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ConfigError(f"prompt_sampler 'difficulty': window={window!r} must be an int >= 1 (the groups a prompt "
                              "must score alike in before it is skipped)")
        if mode not in ("skip", "downweight"):
            raise ConfigError(f"prompt_sampler 'difficulty': mode={mode!r} must be skip or downweight")
        if isinstance(min_weight, bool) or not isinstance(min_weight, (int, float)) or not 0.0 <= min_weight <= 1.0:
            raise ConfigError(f"prompt_sampler 'difficulty': min_weight={min_weight!r} must be a number in [0, 1] (the "
                              "chance a settled prompt is kept in downweight mode)")
        self.window, self.mode, self.min_weight = window, mode, float(min_weight)
        #: row index -> the last ``window`` groups' (lowest, highest) reward
        self.history: dict[int, list[tuple[float, float]]] = {}
        self.draws = 0
        self._skipped = 0
        self._exhausted = 0

    def settled(self, index: int) -> bool:
        """True when the prompt's last ``window`` groups all scored one same reward."""
        h = self.history.get(index)
        if not h or len(h) < self.window:
            return False
        value = h[-1][0]
        return all(lo == hi == value for lo, hi in h[-self.window:])

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        passed = 0
        while len(out) < k:
            (i,) = self.cursor.take(1)
            self.draws += 1
            if self.settled(i) and passed < 2 * self.cursor.n:  # 2n passes in a row cover a whole epoch
                keep = self.mode == "downweight" and \
                    random.Random(f"{self.cursor.seed}:{self.draws}").random() < self.min_weight
                if not keep:
                    passed += 1
                    self._skipped += 1
                    continue
            elif self.settled(i):
                self._exhausted += 1
            passed = 0
            out.append(i)
        return out

    def observe(self, outcomes: Sequence[tuple[int, Sequence[float | None]]]) -> None:
        for index, rewards in outcomes:
            scored = [float(r) for r in rewards if r is not None]
            if not scored:
                continue  # a group nobody could score says nothing about the prompt
            h = self.history.setdefault(int(index), [])
            h.append((min(scored), max(scored)))
            del h[:-self.window]

    def metrics(self) -> dict[str, float]:
        out = {"prompt_sampler/skipped": float(self._skipped), "prompt_sampler/exhausted": float(self._exhausted),
               "prompt_sampler/settled": float(sum(1 for i in self.history if self.settled(i)))}
        self._skipped = self._exhausted = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"draws": self.draws, "history": {str(i): [list(g) for g in h] for i, h in self.history.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.draws = int(state.get("draws", 0))
        self.history = {int(i): [(float(lo), float(hi)) for lo, hi in h] for i, h in (state.get("history") or {}).items()}


def make_prompt_sampler(name: str, cursor: PromptCursor, options: dict[str, Any] | None = None) -> Any:
    """The registered prompt sampler ``name`` over ``cursor``, built with its ``options``."""
    from ..plugins import get

    factory = get("prompt_sampler", name)
    return factory(cursor=cursor, **(options or {}))


@hookimpl
def register_prompt_samplers(register: Callable[..., None]) -> None:
    register("uniform", UniformPromptSampler, description="every row once per epoch, in the seeded order (the default)")
    register("difficulty", DifficultyPromptSampler,
             description="skips (or down-weights) prompts whose last `window` groups all scored one same reward")
