"""The embedded default of ``agent_proxy``: what ``rlcore train --scheduler agent_proxy --agent …``
plays when no dataset is given — products of two numbers the model should not do in its head, for
an agent with a calculator tool (:mod:`rl_plugin_agents.examples.calculator` is one), scored by
the reward the agent returns.
"""

from __future__ import annotations

import random

from rlcore.data.tasks import TINY_MODEL_RECIPE, DefaultTask

PROMPTS = 256


def calculator_rows(n: int = PROMPTS, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        rows.append({"prompt": f"What is {a} * {b}?", "answer": str(a * b)})
    return rows


def calculator_task() -> DefaultTask:
    return DefaultTask(
        name="calculator",
        rows=calculator_rows(),
        description="two-digit products for an agent with a calculator tool, scored by the agent's reward",
        task_config={"output_dir": "rlcore-output/agent_proxy", "reward_funcs": ["agent_reward"],
                     "max_completion_length": 48, "max_prompt_length": 512},
        recipe={**TINY_MODEL_RECIPE, "per_device_train_batch_size": 16},
    )
