"""The embedded default of ``gym_scheduler``: what ``rlcore train --scheduler gym_scheduler`` plays
when no dataset is given.

Each prompt is one episode (``env_config.seed``) of the run's ``--env``, by default ``frozen_lake``
(gymnasium's FrozenLake-v1 on firm ice with progress shaping, :mod:`rl_plugin_gym.presets`). An
action is one word, so a turn ends at the first whitespace (``stop``) and may take at most 4 tokens;
an episode ends at the goal, in a hole, after three invalid replies in a row or at ``max_turns`` (6,
the shortest path's length). The ``recipe`` makes the built-in tiny model learn within minutes on
2 CPU cores; with ``--model`` it is left out and GRPOConfig's defaults for real models apply.
"""

from __future__ import annotations

from rlcore.data.tasks import TINY_MODEL_RECIPE, DefaultTask

PROMPTS = 256


def gym_task() -> DefaultTask:
    return DefaultTask(
        name="frozen_lake",
        rows=[{"prompt": "Play one episode.", "env_config": {"seed": i}} for i in range(PROMPTS)],
        description="gymnasium FrozenLake-v1 (firm ice, progress-shaped reward) unless --env names another",
        task_config={
            "output_dir": "rlcore-output/gym",
            "reward_funcs": ["gym_reward"],
            "max_turns": 6,
            "max_completion_length": 4,
            "max_prompt_length": 256,
        },
        recipe={**TINY_MODEL_RECIPE, "per_device_train_batch_size": 16},
        scheduler_options={"env": "frozen_lake", "stop": [" ", "\n"], "stop_on_truncation": False},
    )
