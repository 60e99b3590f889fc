"""The embedded default task: what ``rlcore train`` with no arguments learns.

``digits``: procedural addition questions ("What is 12 + 7? Reply with digits only."). The reward
gives up to 1 point for answering in digits (the share of non-space characters that are digits)
and 1 more for the right sum. A randomly initialised tiny model samples nearly uniformly from its
1,024-token vocabulary, so it starts at roughly 0.1-0.2 (many BPE tokens are digit runs, learnt
from the number-heavy corpus); GRPO quickly learns to answer in digits only, which at least
doubles the reward within a few dozen steps on a laptop CPU. Getting sums right is beyond a
model this small in minutes — the point is to watch the whole loop work.

Environment schedulers bring their own embedded default the same way: a scheduler class may
define ``default_task()`` returning a :class:`DefaultTask` (prompts for its environment, the reward,
a per-turn token cap and stop strings, and the recipe that makes the tiny model learn in minutes).
``rlcore train`` / ``rlcore rollout`` use it when no dataset is given (:func:`default_task_for`).

This module is registered as a built-in plugin (the ``digits`` reward and the ``rlcore`` dataset
source: ``--dataset rlcore:digits?n=2000&seed=3``, ``rlcore:arithmetic``), so it stays free of torch
imports.
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable

import attrs

from ..errors import DatasetError
from ..hookspecs import hookimpl

TASK_NAME = "digits"
_NUMBER = re.compile(r"\d+")


def digits_dataset(n: int = 512, seed: int = 0, max_operand: int = 20) -> list[dict[str, Any]]:
    """``n`` addition questions with their answers, deterministic in ``seed``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        rows.append({"prompt": f"What is {a} + {b}? Reply with digits only.", "answer": str(a + b)})
    return rows


def digits_reward(completions: list[str], answer: list[Any] | None = None) -> list[float]:
    """Share of digit characters (format, 0-1) plus 1 for the correct first number (rows without an
    ``answer`` get the format part only)."""
    out = []
    for text, ans in zip(completions, answer if answer is not None else [None] * len(completions)):
        chars = [c for c in text if not c.isspace()]
        share = sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0
        m = _NUMBER.search(text)
        correct = 1.0 if (m is not None and ans is not None and m.group(0) == str(ans)) else 0.0
        out.append(share + correct)
    return out


#: GRPOConfig values every embedded tiny-model recipe shares (tuned to learn within minutes on 2 CPU
#: cores); an embedded task adds its batch size and lengths (schedulers' default tasks build on it too)
TINY_MODEL_RECIPE: dict[str, Any] = {
    "num_generations": 8,
    "max_steps": 60,
    "learning_rate": 3e-3,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "loss_type": "dapo",
    "beta": 0.0,
    "temperature": 1.0,
    "logging_steps": 1,
    "save_strategy": "no",
    "seed": 0,
    "report_to": "none",
}

#: GRPOConfig values of the embedded default run (the digits task)
DEFAULT_TRAIN_CONFIG: dict[str, Any] = {
    "output_dir": "rlcore-output/digits",
    "reward_funcs": [TASK_NAME],
    **TINY_MODEL_RECIPE,
    "per_device_train_batch_size": 32,
    "max_completion_length": 8,
    "max_prompt_length": 64,
}


@attrs.define
class DefaultTask:
    """What a run does when the user gives no dataset: the embedded default of a scheduler.

    ``task_config`` (GRPOConfig values) belongs to the task and applies whenever no dataset is
    given: rewards, the per-turn token cap, ``max_turns``. ``recipe`` holds the hyper-parameters
    tuned for the built-in tiny model (learning rate, batch, steps) and applies only when no model
    is given either, so ``--model Qwen/…`` with the default prompts keeps GRPOConfig's defaults for
    real models. ``scheduler_options`` (stop strings, environment options) are task-level too.
    Flags and config files override all of them.
    """

    name: str
    rows: list[dict[str, Any]]
    description: str = ""
    task_config: dict[str, Any] = attrs.field(factory=dict)
    recipe: dict[str, Any] = attrs.field(factory=dict)
    scheduler_options: dict[str, Any] = attrs.field(factory=dict)

    def config(self, tiny_model: bool) -> dict[str, Any]:
        """GRPOConfig defaults of the run: the task's, plus the tiny-model recipe when it applies."""
        return {**self.task_config, **(self.recipe if tiny_model else {})}


def digits_task() -> DefaultTask:
    """The default of single-turn schedulers (kept as it always was: its whole config applies)."""
    return DefaultTask(TASK_NAME, digits_dataset(), "made-up sums, rewarded for answering in digits",
                       task_config=dict(DEFAULT_TRAIN_CONFIG))


#: episodes per embedded env default (one row each, seeded by its index)
ENV_EPISODES = 256


def env_task() -> DefaultTask:
    """The default of an env scheduler without one of its own (``--scheduler env_scheduler --env
    NAME``, or an ``EnvScheduler`` subclass): each prompt is one episode of the env the run names,
    seeded by its row (``env_config.seed``); the env's observations are what the model reads.

    Why not digits: its sums were never shown (the env's reset replaces the prompt) and its
    8-token replies, cut by length, ended every episode at turn 1 before the env saw a step. Here
    a reply cut at the per-turn cap still goes to the env (``stop_on_truncation`` off), so even the
    tiny model, which rarely ends a reply on its own, plays whole episodes."""
    return DefaultTask(
        "env-episodes",
        [{"prompt": "Play one episode.", "env_config": {"seed": i}} for i in range(ENV_EPISODES)],
        "episodes of the env --env names, scored by its rewards (env_reward); its observations are the prompts",
        task_config={"output_dir": "rlcore-output/env", "reward_funcs": ["env_reward"], "max_turns": 4,
                     "max_completion_length": 8, "max_prompt_length": 256},
        recipe={**TINY_MODEL_RECIPE, "per_device_train_batch_size": 16},
        scheduler_options={"stop_on_truncation": False},
    )


def default_task_for(scheduler_factory: Any) -> DefaultTask:
    """The embedded default of a scheduler: its ``default_task()`` when it defines one, the env
    default (:func:`env_task`) for an env scheduler that does not, else digits."""
    make = getattr(scheduler_factory, "default_task", None)
    task = make() if callable(make) else None
    if task is None:
        from ..rollout.env_scheduler import EnvScheduler

        if isinstance(scheduler_factory, type) and issubclass(scheduler_factory, EnvScheduler):
            return env_task()
        return digits_task()
    if not isinstance(task, DefaultTask):
        from ..errors import PluginError

        raise PluginError(f"{getattr(scheduler_factory, '__name__', scheduler_factory)}.default_task() returned "
                          f"{type(task).__name__}; return an rlcore.data.tasks.DefaultTask")
    return task


@hookimpl
def register_rewards(register: Callable[..., None]) -> None:
    register(TASK_NAME, "rlcore.data.tasks:digits_reward", description="default task: answer sums with digits")


_SOURCE_OPTIONS = {"digits": ("n", "seed", "max_operand"), "arithmetic": ()}


def rlcore_source(spec: str, **options: Any) -> list[dict[str, Any]]:
    """The built-in dataset source ``rlcore:``: ``digits`` (options ``n``, ``seed``, ``max_operand``)
    and ``arithmetic`` (the 48-row set ``rlcore rollout`` uses by default)."""
    if spec not in _SOURCE_OPTIONS:
        raise DatasetError(f"rlcore:{spec} is not a built-in dataset; built-in ones are: {', '.join('rlcore:' + k for k in _SOURCE_OPTIONS)}")
    unknown = sorted(set(options) - set(_SOURCE_OPTIONS[spec]))
    if unknown:
        allowed = ", ".join(_SOURCE_OPTIONS[spec]) or "none"
        raise DatasetError(f"rlcore:{spec} has no option {', '.join(unknown)}; its options: {allowed}")
    if spec == "arithmetic":
        from . import builtin_dataset

        return builtin_dataset()
    try:
        values = {k: int(v) for k, v in options.items()}
    except (TypeError, ValueError):
        raise DatasetError(f"rlcore:digits options must be integers, got {options}") from None
    return digits_dataset(**values)


@hookimpl
def register_datasets(register: Callable[..., None]) -> None:
    register("rlcore", rlcore_source, description="built-in tasks: rlcore:digits, rlcore:arithmetic")
