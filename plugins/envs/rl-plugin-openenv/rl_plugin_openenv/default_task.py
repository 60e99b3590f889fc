"""The embedded default of ``openenv_scheduler``: what ``rlcore train --scheduler openenv_scheduler
--env-url URL`` plays when no dataset is given (against ``rlcore openenv serve guess_number``).

Each prompt is one episode of ``guess_number`` on 1..64 with 6 guesses (binary search needs exactly 6), the dense reward on
(``shaped``: a valid guess earns a little, a guess closer than any before it a little more, the
right number 1) and a bare-number reply format. A guess is one word, so a turn ends at the first
whitespace (``stop``) and may take at most 6 tokens; an episode ends when the number is found or
the guesses run out. The ``recipe`` is what makes the built-in tiny model learn within minutes on
2 CPU cores; with ``--model`` it is left out and GRPOConfig's defaults for real models apply.
"""

from __future__ import annotations

from rlcore.data.tasks import TINY_MODEL_RECIPE, DefaultTask

LOW, HIGH, GUESSES = 1, 64, 6
PROMPTS = 256


def guess_number_task() -> DefaultTask:
    rows = [
        {"prompt": "Play guess_number.", "env_config": {"seed": i, "reset_kwargs": {
            "low": LOW, "high": HIGH, "max_attempts": GUESSES, "shaped": True, "reply": "number"}}}
        for i in range(PROMPTS)
    ]
    return DefaultTask(
        name="guess_number",
        rows=rows,
        description=f"OpenEnv guess_number {LOW}..{HIGH}, {GUESSES} guesses, dense reward",
        task_config={
            "output_dir": "rlcore-output/guess_number",
            "reward_funcs": ["openenv_reward"],
            "max_turns": GUESSES,
            "max_completion_length": 6,
            "max_prompt_length": 128,
        },
        recipe={**TINY_MODEL_RECIPE, "per_device_train_batch_size": 32},
        scheduler_options={"stop": [" ", "\n"], "stop_on_truncation": False},
    )
