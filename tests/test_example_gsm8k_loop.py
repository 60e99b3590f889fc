"""examples/gsm8k/loop.py (seed 001 as a hand-written loop) trains like GRPOTrainer: for two steps
from the same seed, on the CPU with the tiny model, the same loss and the same gradients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from rlcore.testing import load_script

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = REPO_ROOT / "examples" / "gsm8k" / "loop.py"


@pytest.fixture
def rlcore_plugins() -> str:
    return "rl-plugin-math"  # the example's rewards (gsm8k_accuracy, gsm8k_format)


def _loop_module() -> Any:
    return load_script(EXAMPLE)


def token_spread(completion_ids: list[list[int]]) -> list[float]:
    """A reward that differs between samples of a random model (GSM8K's own score 0 on all of them),
    so advantages, loss and gradients are not trivially zero."""
    return [float(sum(ids) % 13) / 13.0 for ids in completion_ids]


@pytest.mark.timeout(300)
def test_loop_example_matches_grpo_trainer(tiny_model_dir: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, TrainerCallback

    from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer

    n_gen, max_tokens, lr, seed = 8, 8, 1e-3, 1
    example = _loop_module()
    rows = example.load_gsm8k(limit=4)  # real GSM8K rows from the shared data folder (generated ones without it)

    # --- the loop ------------------------------------------------------------------------------
    loop_grads: list[dict[str, torch.Tensor]] = []

    def capture(step: int, policy: Any, metrics: dict[str, float]) -> None:
        loop_grads.append({n: p.grad.detach().clone() for n, p in policy.model.named_parameters() if p.grad is not None})

    loop_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    history = example.train(
        loop_model, rows, steps=2, prompts_per_step=1, num_generations=n_gen, max_tokens=max_tokens,
        max_prompt_length=256, learning_rate=lr, max_grad_norm=1e6,  # no clipping: grads compared as computed
        rewards=("gsm8k_accuracy", "gsm8k_format", token_spread), seed=seed, on_step=capture,
    )

    # --- GRPOTrainer, the same recipe --------------------------------------------------------------
    trainer_losses: list[float] = []
    trainer_grads: list[dict[str, torch.Tensor]] = []

    class Recording(GRPOTrainer):
        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            trainer_losses.append(float(loss.detach()))
            return loss

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            trainer_grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})

    args = GRPOConfig(
        output_dir=str(tmp_path / "trainer"), reward_funcs=["gsm8k_accuracy", "gsm8k_format"], num_generations=n_gen,
        per_device_train_batch_size=n_gen, gradient_accumulation_steps=1, max_steps=2, max_completion_length=max_tokens,
        max_prompt_length=256, learning_rate=lr, lr_scheduler_type="constant", max_grad_norm=1e6, loss_type="grpo",
        epsilon=0.2, beta=0.0, scale_rewards="group", temperature=1.0, seed=seed, shuffle_dataset=False,
        save_strategy="no", report_to="none", disable_tqdm=True, plots=False, logging_steps=1,
    )
    trainer = Recording(AutoModelForCausalLM.from_pretrained(tiny_model_dir), reward_funcs=[token_spread], args=args,
                        train_dataset=rows, prompt_column="question", system_prompt=example.SYSTEM_PROMPT,
                        callbacks=[Grads()])
    trainer.train()

    assert len(history) == 2 and len(trainer_losses) == 2 and len(loop_grads) == len(trainer_grads) == 2
    for step in range(2):
        assert abs(history[step]["loss"] - trainer_losses[step]) <= 1e-6, (step, history[step]["loss"], trainer_losses[step])
        assert loop_grads[step].keys() == trainer_grads[step].keys()
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in trainer_grads[step].values()))
        assert norm > 1e-4, "the advantages were all zero: the comparison would be vacuous"
        for name, g in trainer_grads[step].items():
            assert torch.allclose(loop_grads[step][name], g, atol=1e-6, rtol=0), (step, name)
    # and the weights after two optimizer steps agree. The two paths' float32 gradients agree to ~1e-7
    # (checked above at 1e-6), not bit for bit (transformers 5.24 / torch 2.13 on CPU); AdamW divides each
    # element's step by its own gradient's running norm, so an element whose gradient is itself ~1e-7
    # moves by a visible share of the learning rate either way (2.3e-6 at lr 1e-3, seen). 1% of the
    # learning rate still fails a wrong lr, beta, epsilon or schedule, which move weights by ~lr.
    loop_params = dict(loop_model.named_parameters())
    for name, p in trainer.model.named_parameters():
        assert torch.allclose(loop_params[name], p, atol=1e-2 * lr, rtol=0), (name, float((loop_params[name] - p).abs().max()))


def test_the_loop_never_trains_on_generated_problems_without_saying_so(tmp_path: Path, monkeypatch, capsys) -> None:
    """A mistyped --data used to train silently on generated problems, and the shared copy was
    looked for at one machine's absolute path only."""
    import json

    import rlcore

    example = _loop_module()
    with pytest.raises(rlcore.DatasetError, match="--data .*no_such.jsonl is not a file"):
        example.load_gsm8k(str(tmp_path / "no_such.jsonl"))
    with pytest.raises(SystemExit) as exc:
        example.main(["--data", str(tmp_path / "no_such.jsonl")])
    assert exc.value.code == 2 and "no_such.jsonl is not a file" in capsys.readouterr().err
    shared = tmp_path / "shared"
    (shared / "gsm8k").mkdir(parents=True)
    row = {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}
    (shared / "gsm8k" / "train.jsonl").write_text(json.dumps(row) + "\n")
    monkeypatch.setenv("RLCORE_SHARED_DATA", str(shared))
    assert example.load_gsm8k() == [row]
    capsys.readouterr()
    monkeypatch.setenv("RLCORE_SHARED_DATA", str(tmp_path / "empty"))
    rows = example.load_gsm8k(limit=3)
    assert len(rows) == 3 and all(r["answer"].split("#### ")[-1].isdigit() for r in rows)
    assert "generated" in capsys.readouterr().err


def test_the_loop_says_what_it_is_doing_before_each_step(tiny_model_dir: str, monkeypatch, capsys) -> None:
    """On SmolLM2 on a CPU the loop printed nothing for 84 s (the model load and the first step):
    now a line on stderr before the load and before each step; stdout keeps one JSON line per step."""
    import json

    monkeypatch.setenv("RLCORE_SHARED_DATA", "/nonexistent")  # generated problems: no data needed
    example = _loop_module()
    example.train(tiny_model_dir, example.load_gsm8k(limit=2), steps=1, prompts_per_step=1, num_generations=2,
                  max_tokens=4, max_prompt_length=256)
    captured = capsys.readouterr()
    err = captured.err
    assert f"loading {tiny_model_dir}" in err and "loaded in" in err
    assert err.index("loaded in") < err.index("step 1/1: sampling 2 completions")
    (line,) = [ln for ln in captured.out.splitlines() if ln.startswith("{")]
    assert json.loads(line)["step"] == 1 and "seconds" in json.loads(line)
