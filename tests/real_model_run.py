"""One small GRPO run on the real model, written for ``tests/test_real_model_resume.py``: the test
runs it as a separate process, kills it with a signal after a checkpoint, runs it again to resume,
and compares the metrics with an uninterrupted run of the same script.

    python tests/real_model_run.py MODEL ROWS.jsonl OUT whole|checkpointed|resume

``whole`` saves only its final weights (OUT/final); ``checkpointed`` saves after every step; ``resume`` continues the run in OUT
from its latest checkpoint (and keeps saving). Rewards: rl-plugin-math's gsm8k pair plus a reward
that differs between any two samples (the real model scores 0 on GSM8K at 16 tokens; without it the
gradients would be 0 and the optimizer state a resume must restore would be trivial).
"""

from __future__ import annotations

import json
import os
import sys

from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer

STEPS, SAVE_STEPS = 2, 1


def token_spread(completion_ids: list[list[int]]) -> list[float]:
    return [float(sum(ids) % 1009) / 1009.0 for ids in completion_ids]


def main(model: str, rows_path: str, out: str, mode: str) -> None:
    with open(rows_path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    args = GRPOConfig(
        output_dir=out, reward_funcs=["gsm8k_accuracy", "gsm8k_format"], num_generations=2,
        per_device_train_batch_size=4, max_steps=STEPS, max_completion_length=16, learning_rate=1e-4,
        lr_scheduler_type="linear", gradient_checkpointing=False, seed=0, report_to="none", disable_tqdm=True,
        plots=False, logging_steps=1, save_strategy="no" if mode == "whole" else "steps", save_steps=SAVE_STEPS,
    )
    trainer = GRPOTrainer(model, reward_funcs=[token_spread], args=args, train_dataset=rows, prompt_column="question")
    trainer.train(resume_from_checkpoint=True if mode == "resume" else None)
    if mode == "whole":  # the final weights, to hold the resumed run's last checkpoint to
        trainer.save_model(os.path.join(out, "final"))


if __name__ == "__main__":
    main(*sys.argv[1:5])
