"""GRPO on the real pretrained model (SmolLM2-135M-Instruct, float32, CPU), not the tiny one: two
GRPOTrainer steps on real GSM8K rows with rl-plugin-math's gsm8k rewards (finite loss, every weight
moves, no invariant violation), and the loop API (``rlcore.loop``) written with the same settings
trains exactly like that run (the same losses, the same weights to 1e-5). The prompts carry no
system message, so SmolLM2's template injects its own; eos = pad = ``<|im_end|>``; the embeddings
are tied to the head.

Shapes are small (2 prompts x 2 samples x 16 tokens, the shortest GSM8K questions): every forward
and backward of this model on a CPU costs seconds. The trainer runs once for both tests.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import rlcore
from rlcore import SamplingParams
from rlcore.loop import Policy, Rewards, Rollout, make_prompts, sync_weights

MATH = "rl-plugin-math"  # the gsm8k rewards' distribution: the only third-party plugin these tests load


@pytest.fixture
def rlcore_plugins() -> str:
    return MATH


@pytest.fixture(scope="module")
def gsm8k_rows(shared_data: Path) -> list[dict[str, Any]]:
    """The four shortest questions of GSM8K's train split (real rows, short prompts: cheap forwards)."""
    path = shared_data / "gsm8k" / "train.jsonl"
    assert path.is_file(), f"the shared data folder {shared_data} has no gsm8k/train.jsonl"
    with path.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return sorted(rows, key=lambda r: len(r["question"]))[:4]


NUM_GENERATIONS, PROMPTS_PER_STEP, MAX_TOKENS, STEPS, LR, SEED = 2, 2, 16, 2, 1e-4, 3


def token_spread(completion_ids: list[list[int]]) -> list[float]:
    """A reward that differs between any two different samples: the real model scores 0 on GSM8K
    at this length (no ``#### N`` line, rarely the right last number), so without it every advantage
    would be 0 and nothing would train. The gsm8k rewards are still computed and summed in."""
    return [float(sum(ids) % 1009) / 1009.0 for ids in completion_ids]


@pytest.fixture(scope="module")
def math_plugins() -> Any:
    """rl-plugin-math loaded for the module-scoped runs below (set up before the per-test isolation)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLCORE_PLUGINS", MATH)
        rlcore.plugins.reload_plugins()
        yield


@pytest.fixture(scope="module")
def grpo_run(smollm2_dir: str, gsm8k_rows: list[dict[str, Any]], math_plugins: Any, tmp_path_factory: Any) -> Any:
    """Two GRPOTrainer steps on SmolLM2 (prompts as GSM8K questions, no system prompt: the model's
    template injects its own), rewards gsm8k_accuracy + gsm8k_format + token_spread."""
    from transformers import AutoModelForCausalLM

    from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer

    losses: list[float] = []

    class Recording(GRPOTrainer):
        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            losses.append(float(loss.detach()))
            return loss

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    names = list(before)
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("grpo")), reward_funcs=["gsm8k_accuracy", "gsm8k_format"],
        num_generations=NUM_GENERATIONS, per_device_train_batch_size=NUM_GENERATIONS * PROMPTS_PER_STEP,
        gradient_accumulation_steps=1, max_steps=STEPS, max_completion_length=MAX_TOKENS, max_prompt_length=256,
        learning_rate=LR, lr_scheduler_type="constant", max_grad_norm=1.0, loss_type="grpo", epsilon=0.2, beta=0.0,
        scale_rewards="group", temperature=1.0, seed=SEED, shuffle_dataset=False, save_strategy="no", gradient_checkpointing=False,
        report_to="none", disable_tqdm=True, plots=False, logging_steps=1,
    )
    trainer = Recording(model, reward_funcs=[token_spread], args=args, train_dataset=gsm8k_rows, prompt_column="question")
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
    after = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    # how far each weight moved, then only the final weights are kept (memory: the loop test's policy comes next)
    moved = {n: float((after[n] - before.pop(n)).abs().max()) for n in names}
    del trainer, model, before
    gc.collect()
    return SimpleNamespace(after=after, moved=moved, logs=logs, losses=losses)


def test_grpo_trains_two_steps_on_gsm8k_with_the_gsm8k_rewards(grpo_run: Any) -> None:
    logs = grpo_run.logs
    assert len(logs) == STEPS and len(grpo_run.losses) == STEPS
    for h in logs:
        assert math.isfinite(h["loss"]) and math.isfinite(h["grad_norm"]) and h["grad_norm"] > 0, h
        assert h["invariant_violations"] == 0 and h["failed_trajectories"] == 0, h
        for name in ("gsm8k_accuracy", "gsm8k_format"):  # scored on every sample, never an error
            assert 0.0 <= h[f"rewards/{name}/mean"] <= 1.0 and h[f"reward_errors/{name}"] == 0, (name, h)
        assert h["rewards/token_spread/std"] > 0, h  # the samples differ: advantages are not all 0
        assert 0 < h["completions/mean_length"] <= MAX_TOKENS
        assert math.isfinite(h["entropy"]) and h["entropy"] > 0
    assert max(grpo_run.moved.values()) >= LR, grpo_run.moved  # Adam moves a weight with a gradient by about lr a step
    unchanged = [n for n, d in grpo_run.moved.items() if d == 0.0]
    assert not unchanged, unchanged[:5]  # every one, the tied embedding / lm_head included


def test_the_loop_api_trains_like_grpo_trainer(smollm2_dir: str, gsm8k_rows: list[dict[str, Any]], grpo_run: Any,
                                               math_plugins: Any) -> None:
    """docs/loop.md's loop, written with the trainer run's settings: the same two losses and gradient
    norms, the same weights after two optimizer steps (1e-5; the steps moved them by ~1e-4 each)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    policy = Policy(AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32), loss="grpo", epsilon=0.2,
                    beta=0.0, learning_rate=LR, max_grad_norm=1.0, temperature=1.0, disable_dropout=False)
    sampler = rlcore.get("sampler", "hf")(policy.model, policy.tokenizer, seed=SEED)
    rollout = Rollout(sampler, SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0))
    rewards = Rewards(["gsm8k_accuracy", "gsm8k_format", token_spread])
    advantage = rlcore.get("advantage", "grpo")()
    losses, grad_norms = [], []
    try:
        for step in range(STEPS):
            rows = gsm8k_rows[step * PROMPTS_PER_STEP:(step + 1) * PROMPTS_PER_STEP]
            prompts = make_prompts(rows, policy.tokenizer, prompt_column="question", max_prompt_length=256)
            sync_weights(policy, sampler)
            trajectories = rollout(prompts, num_generations=NUM_GENERATIONS)
            assert rollout.last_stats["invariant_violations"] == 0
            adv = advantage(rewards(trajectories), num_generations=NUM_GENERATIONS, scale="group")
            losses.append(policy.forward_backward(trajectories, adv)["loss"])
            grad_norms.append(policy.clip_grad_and_step()["grad_norm"])
    finally:
        asyncio.run(sampler.close())
    assert losses == pytest.approx(grpo_run.losses, abs=1e-5), (losses, grpo_run.losses)
    trainer_norms = [h["grad_norm"] for h in grpo_run.logs]
    assert grad_norms == pytest.approx(trainer_norms, rel=1e-4) and min(trainer_norms) > 0, (grad_norms, trainer_norms)
    worst = max(float((p.detach() - grpo_run.after[name]).abs().max()) for name, p in policy.model.named_parameters())
    assert worst <= 1e-5 < max(grpo_run.moved.values()), (worst, max(grpo_run.moved.values()))
