"""GRPO on GSM8K as a hand-written loop (seed 001, step for step, in rlcore's names).

    python examples/gsm8k/loop.py --data PATH/train.jsonl   # Qwen2.5-0.5B-Instruct on a local GSM8K copy
    python examples/gsm8k/loop.py --model PATH --steps 2 --max-tokens 16 --prompts-per-step 1
    python examples/gsm8k/loop.py --ray            # the seed's placement: a model group and a sampler group

The same recipe as ``config.yaml`` / ``train.py`` (GRPOTrainer); here every step of the loop is a
line you can change. Comments name the seed's step each line stands for. GSM8K is read from
``--data``, else from ``gsm8k/train.jsonl`` in the shared data folder (``$RLCORE_SHARED_DATA``, or
``../shared/data`` next to the checkout) when it is there, else a small generated set of GSM8K-style
word problems, which the script says it uses. ``tests`` in rl-plugin-math run it for two steps on
the CPU and hold it to GRPOTrainer: same loss, same gradients.

``--ray`` places the loop as the seed does: the policy data-parallel on a ``model`` group of
``--model-workers`` Ray actors and the sampler on a ``sampler`` group of ``--sampler-workers`` (one
copy of the model each; the loop's calls do not change). ``--device gpu`` gives every worker a GPU
(the seed's 4 + 4 is ``--model-workers 4 --sampler-workers 4 --device gpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import rlcore
from rlcore import SamplingParams
from rlcore.distributed import DeviceGroup, initialize, make_sampler, shutdown
from rlcore.loop import Policy, Rewards, Rollout, make_prompts, sync_weights

HERE = Path(__file__).resolve().parent


def shared_gsm8k() -> Path:
    """``gsm8k/train.jsonl`` in the shared data folder: ``$RLCORE_SHARED_DATA``, else ``../shared/data``
    beside the repository (the layout this repository's tests use)."""
    root = os.environ.get("RLCORE_SHARED_DATA") or HERE.parents[2] / "shared" / "data"
    return Path(root) / "gsm8k" / "train.jsonl"


SYSTEM_PROMPT = ('Solve the math word problem. Think step by step, then write the final answer on its own last '
                 'line in the form "#### <number>".')


def load_gsm8k(path: str | os.PathLike[str] | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """GSM8K rows (``question``, ``answer`` ending in ``#### N``): the given file (which must exist),
    the shared copy, or — when there is none — generated problems in the same format, said on stderr."""
    if path and not Path(path).is_file():
        raise rlcore.DatasetError(f"--data {path} is not a file; pass a GSM8K-format .jsonl (question, answer)")
    file = Path(path) if path else shared_gsm8k()
    if file.is_file():
        with file.open(encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return rows[:limit] if limit else rows
    print(f"no GSM8K at {file} (pass --data or set RLCORE_SHARED_DATA): training on {limit or 64} generated "
          "GSM8K-style problems", file=sys.stderr)
    rng = random.Random(0)
    rows = []
    for _ in range(limit or 64):
        a, b, c = rng.randint(2, 40), rng.randint(2, 40), rng.randint(2, 9)
        rows.append({"question": f"Tom has {a} apples and buys {b} more, then gives away {c}. How many apples does he have?",
                     "answer": f"{a}+{b}-{c} = {a + b - c}\n#### {a + b - c}"})
    return rows


def train(
    model: Any = "Qwen/Qwen2.5-0.5B-Instruct",
    rows: Sequence[dict[str, Any]] | None = None,
    *,
    steps: int = 500,
    prompts_per_step: int = 8,
    num_generations: int = 8,
    max_tokens: int = 512,
    max_prompt_length: int = 512,
    temperature: float = 1.0,
    learning_rate: float = 1e-6,
    max_grad_norm: float = 1.0,
    rewards: Sequence[Any] = ("gsm8k_accuracy", "gsm8k_format"),
    seed: int = 1,
    on_step: Callable[[int, Policy, dict[str, float]], None] | None = None,
    save_to: str | None = None,
    ray: bool = False,
    model_workers: int = 2,
    sampler_workers: int = 2,
    device: str = "cpu",
) -> list[dict[str, float]]:
    """Run the loop for ``steps`` optimizer steps; returns each step's metrics. ``on_step(step,
    policy, metrics)`` runs after ``forward_backward`` and before the optimizer step (the gradients
    are in ``policy.model``'s ``.grad``; with ``ray`` the policy lives in its workers).

    ``ray``: the seed's placement — ``model`` (a path) trained data-parallel on ``model_workers``
    Ray actors, sampled by ``sampler_workers`` more (``device`` ``cpu`` or ``gpu``)."""
    import torch

    torch.manual_seed(seed)
    rows = list(rows) if rows is not None else load_gsm8k()
    if ray:
        if not isinstance(model, str):
            raise rlcore.ConfigError("--ray: every worker loads its own copy; pass the model's path or hub id")
        # seed: twinkle.initialize(mode='ray', groups=[DeviceGroup('model', ranks=[0..3]), DeviceGroup('sampler', ranks=[4..7])])
        initialize(mode="ray", groups=[DeviceGroup("model", num_workers=model_workers, device=device),
                                       DeviceGroup("sampler", num_workers=sampler_workers, device=device)])
        try:
            return _train(model, rows, steps, prompts_per_step, num_generations, max_tokens, max_prompt_length,
                          temperature, learning_rate, max_grad_norm, rewards, seed, on_step, save_to, remote=True)
        finally:
            shutdown()
    return _train(model, rows, steps, prompts_per_step, num_generations, max_tokens, max_prompt_length,
                  temperature, learning_rate, max_grad_norm, rewards, seed, on_step, save_to, remote=False)


def _train(model: Any, rows: list[dict[str, Any]], steps: int, prompts_per_step: int, num_generations: int,
           max_tokens: int, max_prompt_length: int, temperature: float, learning_rate: float, max_grad_norm: float,
           rewards: Sequence[Any], seed: int, on_step: Any, save_to: str | None, *, remote: bool) -> list[dict[str, float]]:
    # seed: model = TransformersModel(model_id, ...) on the "model" group; set_loss('GRPOLoss', epsilon=0.2);
    #       set_optimizer('AdamW', lr=...)  — rlcore: a Policy (HF model + loss plugin + AdamW);
    #       --ray: on the "model" group, data-parallel over its workers (remote_group="model")
    started = time.perf_counter()
    progress(f"loading {model if isinstance(model, str) else type(model).__name__} …")
    policy = Policy(model, loss="grpo", epsilon=0.2, beta=0.0, learning_rate=learning_rate,
                    max_grad_norm=max_grad_norm, temperature=temperature, disable_dropout=False,
                    remote_group="model" if remote else None)
    # seed: sampler = Sampler(model_id, ...) on the "sampler" group — rlcore: the colocated hf sampler,
    #       generating with the policy's own module (swap in "vllm" / "openai"; sync_weights stays);
    #       --ray: one hf sampler per worker of the "sampler" group behind one pool
    if remote:
        sampler = make_sampler("hf", model, remote_group="sampler", seed=seed)
    else:
        sampler = rlcore.get("sampler", "hf")(policy.model, policy.tokenizer, seed=seed)
    # seed: sampling_params = SamplingParams(max_tokens=..., logprobs=1)
    sampling_params = SamplingParams(max_tokens=max_tokens, logprobs=1, temperature=temperature)
    rollout = Rollout(sampler, sampling_params)  # single turn: the "default" scheduler
    # seed: reward_fns = [GSM8KAccuracy(), GSM8KFormat()]
    reward_fn = Rewards(list(rewards))
    # seed: advantage_fn = GRPOAdvantage()
    advantage_fn = rlcore.get("advantage", "grpo")()

    history: list[dict[str, float]] = []
    cursor = 0
    progress(f"loaded in {time.perf_counter() - started:.0f}s; {steps} steps of {prompts_per_step} prompts × "
             f"{num_generations} completions (up to {max_tokens} tokens each)")
    for step in range(steps):
        step_started = time.perf_counter()
        progress(f"step {step + 1}/{steps}: sampling {prompts_per_step * num_generations} completions, then scoring "
                 "and one optimizer step …")
        # seed: batch = next(dataloader)  (prompts_per_step questions)
        batch_rows = [rows[(cursor + i) % len(rows)] for i in range(prompts_per_step)]
        cursor += prompts_per_step
        prompts = make_prompts(batch_rows, policy.tokenizer, prompt_column="question", system_prompt=SYSTEM_PROMPT,
                               max_prompt_length=max_prompt_length)
        # seed: ckpt_manager.sync_weights()  (merge_and_sync for LoRA) — the sampler follows the policy
        sync_weights(policy, sampler)
        # seed: responses = sampler.sample(prompts * num_generations, sampling_params)
        trajectories = rollout(prompts, num_generations=num_generations)
        # seed: rewards = [sum(fn(trajectories)) ...] — every reward, weighted, on the sampled trajectories
        scores = reward_fn(trajectories)
        # seed: advantages = GRPOAdvantage()(rewards, num_generations=8, scale='group')
        advantages = advantage_fn(scores, num_generations=num_generations, scale="group")
        # seed: model.forward_backward(inputs=trajectories, advantages=advantages, old_logps=...)
        #       old_logps: this is the first pass over fresh samples, so the policy that sampled is the
        #       current one (None: ratio 1); the sampler's own logprobs travel in the batch for IS correction
        metrics = policy.forward_backward(inputs=trajectories, advantages=advantages, old_logps=None)
        if on_step is not None:
            on_step(step, policy, metrics)
        # seed: model.clip_grad_and_step()
        metrics.update(policy.clip_grad_and_step())
        valid = [s for s in scores if s is not None]
        metrics["reward"] = sum(valid) / len(valid) if valid else float("nan")
        for name, column in reward_fn.columns.items():
            values = [v for v in column if v is not None]
            metrics[f"rewards/{name}"] = sum(values) / len(values) if values else float("nan")
        metrics["step"] = step + 1
        metrics["seconds"] = time.perf_counter() - step_started
        history.append(metrics)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()
                          if k in ("step", "loss", "reward", "grad_norm", "entropy", "seconds")}), flush=True)
    if save_to:
        # seed: model.save(output_dir)
        policy.save(save_to)
    return history


def progress(line: str) -> None:
    """A progress line on stderr (stdout keeps one JSON line per step): on a CPU a real model's step
    takes minutes, and the loop printed nothing until the first one ended."""
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--data", default=None, help="a GSM8K-format .jsonl (default: the shared copy, else generated problems)")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--learning-rate", type=float, default=1e-6)
    ap.add_argument("--save-to", default=None)
    ap.add_argument("--ray", action="store_true", help="the seed's placement: a model group and a sampler group on Ray")
    ap.add_argument("--model-workers", type=int, default=2, help="--ray: data-parallel policy workers")
    ap.add_argument("--sampler-workers", type=int, default=2, help="--ray: sampler workers")
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="--ray: what each worker holds")
    a = ap.parse_args(argv)
    try:
        rows = load_gsm8k(a.data)
    except rlcore.RlcoreError as exc:
        ap.error(str(exc))  # one line and exit status 2, like rlcore's commands
    train(a.model, rows, steps=a.steps, prompts_per_step=a.prompts_per_step,
          num_generations=a.num_generations, max_tokens=a.max_tokens, learning_rate=a.learning_rate, save_to=a.save_to,
          ray=a.ray, model_workers=a.model_workers, sampler_workers=a.sampler_workers, device=a.device)


if __name__ == "__main__":
    main()
