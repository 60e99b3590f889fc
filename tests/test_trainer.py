"""GRPOTrainer on the real tiny model: step bookkeeping, metrics, every loss, LoRA, weight sync,
groups from multi-trajectory schedulers, and plots on Ctrl-C."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch

from rlcore.rollout import RolloutScheduler
from rlcore.data.tasks import digits_dataset
from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer
from rlcore.types import Trajectory

REQUIRED_METRICS = [
    "step", "reward", "reward_std", "rewards/digits", "advantage_zero_std_frac", "completion_length",
    "completion_length/max", "num_turns", "loss", "kl", "clip_ratio/low", "clip_ratio/high", "entropy",
    "failed_trajectories", "step_time", "rollout_time", "train_time", "tokens_per_second",
]


def config(tmp_path: Any, **over: Any) -> GRPOConfig:
    values: dict[str, Any] = dict(
        output_dir=str(tmp_path), reward_funcs=["digits"], num_generations=4, per_device_train_batch_size=8,
        max_completion_length=4, max_steps=2, learning_rate=1e-3, save_strategy="no", seed=0, logging_steps=1,
        disable_tqdm=True, report_to="none",
    )
    values.update(over)
    return GRPOConfig(**values)


def metrics(tmp_path: Any) -> list[dict[str, Any]]:
    with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_generation_bookkeeping_and_metric_names(tmp_path: Any, tiny_model_dir: str) -> None:
    # 4 micro-steps per generation (TRL's steps_per_generation), 2 per optimizer step, μ=2 passes:
    # one generation feeds 4 optimizer steps; old logps recorded, reference model for beta>0.
    args = config(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2, generation_batch_size=16,
                  num_iterations=2, beta=0.05, loss_type="grpo", is_correction="token_truncate", max_steps=4,
                  temperature=0.7)
    assert args.generation_batch_size == 16 and args.prompts_per_generation == 4
    trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(32))
    assert trainer.ref_model is not None
    assert trainer.sampler.model is trainer.model  # colocated hf sampler shares the module
    trainer.train()
    assert trainer.state.global_step == 4
    assert trainer._generations == 1
    assert trainer.cursor.pos == 4
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        missing = [k for k in REQUIRED_METRICS if k not in r]
        assert not missing, missing
        # the colocated sampler and the trainer compute the same distribution (temperature included)
        assert abs(r["is_ratio/mean"] - 1.0) < 1e-3 and abs(r["is_ratio/max"] - 1.0) < 1e-2
        assert r["completion_length/max"] <= 4
    assert rows[-1]["kl"] > 0  # the policy moved away from the reference within the generation
    assert os.path.exists(os.path.join(tmp_path, "plots", "reward.png"))
    assert os.path.exists(os.path.join(tmp_path, "plots", "completion_length.png"))


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo"])
def test_every_loss_trains(tmp_path: Any, tiny_model_dir: str, loss_type: str) -> None:
    args = config(tmp_path, loss_type=loss_type, max_steps=1, learning_rate=5e-3,
                  epsilon_high=5.0 if loss_type == "cispo" else None)
    trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(16))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = sum(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    assert changed > 0
    assert torch.isfinite(torch.tensor(metrics(tmp_path)[0]["loss"]))


def test_lora_trains_adapters_and_merges_for_a_separate_sampler(tmp_path: Any, tiny_model_dir: str) -> None:
    from rlcore.sampling.hf.sampler import HFSampler

    separate = HFSampler(tiny_model_dir, seed=0, dtype="float32")  # the trainer's precision (CUDA's default is bf16)
    args = config(tmp_path, use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, learning_rate=2e-2, max_steps=2)
    trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(16), sampler=separate)
    base_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}
    trainer.train()
    for n, p in trainer.model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(base_before[n], p), n
    trainer.sync_weights()
    merged = trainer.model.merge_and_unload()
    for name, p in separate.model.named_parameters():
        assert torch.allclose(p, dict(merged.named_parameters())[name], atol=1e-6), name
    assert separate.policy_version >= 2
    q = separate.model.model.layers[0].self_attn.q_proj.weight
    assert not torch.allclose(q, base_before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])


class TwoRounds(RolloutScheduler):
    """Returns two trajectories per request (one per round), as ms-swift style schedulers may."""

    async def run(self, infer_request: Trajectory) -> list[Trajectory]:
        first = await super().run(infer_request)
        again = Trajectory(prompt_ids=list(infer_request.prompt_ids),
                           messages=[m for m in first.messages if m.get("role") != "assistant"],
                           data=dict(infer_request.data))
        second = await super().run(again)
        return [first, second]


def test_several_trajectories_per_request_keep_groups(tmp_path: Any, tiny_model_dir: str) -> None:
    seen: list[list[str]] = []

    def grouped(trajectories: list[Trajectory], completions: list[str]) -> list[float]:
        seen.append([t.group_id for t in trajectories])
        return [float(len(c) % 3) for c in completions]

    args = config(tmp_path, reward_funcs=None, max_steps=1)
    trainer = GRPOTrainer(tiny_model_dir, reward_funcs=[grouped], args=args, train_dataset=digits_dataset(16),
                          scheduler=TwoRounds())
    micro = trainer._generate_and_score()
    groups = seen[-1]
    assert len(groups) == 2 * args.generation_batch_size
    counts: dict[str, int] = {}
    for g in groups:
        counts[g] = counts.get(g, 0) + 1
    assert len(counts) == args.prompts_per_generation
    assert set(counts.values()) == {2 * args.num_generations}
    assert trainer.advantage.stats.groups == args.prompts_per_generation
    assert sum(mb["batch"].size for mb in micro) == len(groups)


class _CtrlC:
    """A callback that presses Ctrl-C once step 2 is logged (fault injection)."""

    def __getattr__(self, name: str) -> Any:
        if name == "on_log":
            def press(args: Any, state: Any, control: Any, **kw: Any) -> None:
                if state.global_step == 2:
                    raise KeyboardInterrupt
            return press
        return lambda *a, **k: None


def test_ctrl_c_still_writes_plots(tmp_path: Any, tiny_model_dir: str) -> None:
    args = config(tmp_path, max_steps=5, disable_tqdm=False)
    trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(16), callbacks=[_CtrlC()])
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert [r["step"] for r in metrics(tmp_path)] == [1, 2]
    assert os.path.getsize(os.path.join(tmp_path, "plots", "reward.png")) > 1000


def test_failed_trajectories_are_counted_and_not_trained(tmp_path: Any, tiny_model_dir: str) -> None:
    class Flaky(RolloutScheduler):
        calls = 0

        def on_turn_end(self, infer_request: Trajectory, response_choice: Any, current_turn: int) -> Any:
            Flaky.calls += 1
            if Flaky.calls % 4 == 0:
                raise RuntimeError("env went away")
            return None

    args = config(tmp_path, max_steps=1)
    trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(16), scheduler=Flaky())
    micro = trainer._generate_and_score()
    assert trainer._gen_metrics["failed_trajectories"] == args.generation_batch_size // 4
    b = micro[0]["batch"]
    assert b.size == args.generation_batch_size
    failed_rows = (b.completion_mask.sum(-1) == 0).sum()
    assert int(failed_rows) >= args.generation_batch_size // 4


def test_multi_turn_step_rewards_train_with_gigpo(tmp_path: Any, tiny_model_dir: str) -> None:
    from rlcore.rollout import MultiTurnScheduler

    class Echo(MultiTurnScheduler):
        """Two turns; the env's step reward is the share of digits in each reply."""

        def on_turn_end(self, infer_request: Trajectory, response_choice: Any, current_turn: int) -> Any:
            text = response_choice.message.content
            return {"reward": sum(c.isdigit() for c in text) / max(1, len(text))}

        def step(self, infer_request: Trajectory, response_choice: Any, current_turn: int) -> Any:
            infer_request.messages.append({"role": "user", "content": "again"})
            return {"infer_request": infer_request}

        def check_finished(self, infer_request: Trajectory, response_choice: Any, current_turn: int) -> bool:
            return current_turn >= 2

    args = config(tmp_path, reward_funcs=["env_reward"], advantage="gigpo", max_steps=1)
    trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(16), scheduler=Echo())
    micro = trainer._generate_and_score()
    b = micro[0]["batch"]
    assert trainer._gen_metrics["num_turns"] == 2.0
    # observation tokens of turn 2 are in the sequence but never trained
    n_tokens = int(b.attention_mask.sum())
    n_trained = int(b.completion_mask.sum())
    assert n_trained < n_tokens
    # step-level advantages: within a trajectory the two turns may differ
    per_row = [set(b.advantages[i][b.completion_mask[i] > 0].tolist()) for i in range(b.size)]
    assert any(len(s) == 2 for s in per_row)
    trainer.train()
    assert metrics(tmp_path)[0]["num_turns"] == 2.0


def test_mask_truncated_completions_leaves_them_out(tmp_path: Any, tiny_model_dir: str) -> None:
    # 3 tokens are never enough to finish: every trajectory is length-truncated
    args = config(tmp_path, max_completion_length=3, mask_truncated_completions=True, max_steps=1)
    trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(16))
    micro = trainer._generate_and_score()
    truncated = trainer._gen_metrics["truncated_trajectories"]
    assert truncated > 0
    rows_trained = sum(int((mb["batch"].completion_mask.sum(-1) > 0).sum()) for mb in micro)
    assert rows_trained == args.generation_batch_size - truncated
    trainer.train()  # a step with nothing (or little) to train on still completes
    assert trainer.state.global_step == 1


def test_reward_errors_are_logged_per_reward(tmp_path: Any, tiny_model_dir: str, caplog: Any) -> None:
    calls = {"n": 0}

    def flaky(completions: list[str], trajectories: list[Trajectory]) -> list[float]:
        # the first generation: the batch call raises, then every other single sample raises; later ones work
        calls["n"] += 1
        if calls["n"] == 1 or (calls["n"] <= 1 + 8 and calls["n"] % 2 == 0):
            raise RuntimeError("scorer offline")
        return [1.0] * len(completions)

    flaky.__name__ = "flaky"
    args = config(tmp_path, reward_funcs=["digits"], max_steps=2)
    trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(16), reward_funcs=[flaky])
    with caplog.at_level("WARNING", logger="rlcore.trainer.grpo"):
        trainer.train()
    rows = metrics(tmp_path)
    assert rows[0]["reward_errors/flaky"] == 4.0  # 2 prompts × 4 generations, each isolated; half raised
    assert rows[0]["reward_errors/digits"] == 0.0
    assert rows[1]["reward_errors/flaky"] == 0.0 and rows[1]["rewards/flaky"] == 1.0
    warned = [r for r in caplog.records if "raised on 4 of 8 samples" in r.getMessage()]
    assert len(warned) == 1 and "RuntimeError: scorer offline" in warned[0].getMessage()


def test_reward_failing_on_every_sample_stops_the_run(tmp_path: Any, tiny_model_dir: str) -> None:
    from rlcore import RewardFunctionError

    def broken(completions: list[Any], **kwargs: Any) -> list[float]:
        return [len(c[0]["content"]) for c in completions]  # conversational shape on a standard dataset

    args = config(tmp_path, reward_funcs=None, max_steps=2)
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)]
    trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=rows, reward_funcs=[broken])
    with pytest.raises(RewardFunctionError, match=r"reward 'broken' raised on all 8 samples \(TypeError") as info:
        trainer.train()
    assert isinstance(info.value.__cause__, TypeError)
    assert trainer.state.global_step == 0
