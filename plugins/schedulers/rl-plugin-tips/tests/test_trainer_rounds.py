"""The trainer accepts a scheduler that returns several trajectories per request (one per round)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def never_right(text: str, reference: Any) -> bool:
    """Referenced by name from ``scheduler_options`` below: every answer gets a second round."""
    return False


@pytest.mark.timeout(300)
def test_grpo_step_with_thinking_tips_rounds(tiny_model_dir: str, tmp_path: Path, monkeypatch) -> None:
    from transformers import AutoTokenizer

    from rlcore.testing import ScriptedSampler
    from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer

    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # so "test_trainer_rounds:never_right" imports

    seen: list[list[Any]] = []

    class RecordingTrainer(GRPOTrainer):
        def rollout(self, prompts):  # records what the real rollout returned
            trajs = super().rollout(prompts)
            seen.append(trajs)
            return trajs

    rows = [{"question": f"what is {a} + {a}", "answer": f"#### {2 * a}"} for a in range(1, 5)]
    args = GRPOConfig(
        output_dir=str(tmp_path), max_steps=1, num_generations=4, per_device_train_batch_size=4,
        max_completion_length=32, max_prompt_length=256, learning_rate=1e-4, report_to="none",
        scheduler="thinking_tips_scheduler", max_turns=2,
        scheduler_options={"accuracy": "test_trainer_rounds:never_right"},
        reward_funcs=["gsm8k_accuracy"], plots=False, disable_tqdm=True, save_strategy="no",
    )
    # scripted choices (always a finished, wrong answer) so every request really has two rounds;
    # the trainer, scheduler, rewards and loss are real
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    sampler = ScriptedSampler(["<think>1 + 1 = 3</think><answer>3</answer>"], tok)
    trainer = RecordingTrainer(tiny_model_dir, args=args, train_dataset=rows, prompt_column="question", sampler=sampler)
    trainer.train()
    assert trainer.state.global_step == 1
    trajs = seen[0]
    assert len(trajs) == 8 and sorted(t.infos["round"] for t in trajs) == [1, 1, 1, 1, 2, 2, 2, 2]
    assert len(sampler.calls) == 8 and all(t.status == "ok" for t in trajs)
    assert len({t.group_id for t in trajs}) == 1  # one prompt: all rounds in its group
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged and "rewards/gsm8k_accuracy" in logged[-1]
