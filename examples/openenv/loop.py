"""Multi-turn GRPO against an OpenEnv server as a hand-written loop (seed 000, step for step).

    pip install rl-plugin-openenv
    rlcore openenv serve guess_number --port 8000 &                  # the environment
    python examples/openenv/loop.py --env-url http://127.0.0.1:8000  # the loop

Each episode is one game of guess_number. As in the seed, the environment is driven through tools:
every trajectory gets its own ``EnvTool`` (its own server session) in its own ``ToolManager``, the
model calls ``guess`` as a tool, and the rewards are read from the env tools (the sum of step
rewards). ``--actions text`` plays with bare-number replies instead (``openenv_scheduler``), which
a small model picks up faster. Comments name the seed's step each line stands for.
``config.yaml`` is the same recipe for ``rlcore train`` (GRPOTrainer).

``--ray`` places it as the seed does: the policy data-parallel on a ``model`` group of
``--model-workers`` Ray actors, the sampler on a ``sampler`` group of ``--sampler-workers`` (a
trajectory's turns stay on one sampler worker, whose prefix cache then serves them); the env
sessions and the loop stay in this process.

    python examples/openenv/loop.py --env-url http://127.0.0.1:8000 --ray --model-workers 2 --sampler-workers 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable, Sequence

import rlcore
from rlcore import SamplingParams
from rlcore.distributed import DeviceGroup, initialize, make_sampler, shutdown
from rlcore.loop import MultiTurnRollout, Policy, Rewards, make_prompts, sync_weights

SCHEDULERS = {"tools": "openenv_tool_scheduler", "text": "openenv_scheduler"}


def episodes(n: int = 256, *, low: int = 1, high: int = 64, max_attempts: int = 6) -> list[dict[str, Any]]:
    """One row per game: the server's reset gets ``env_config`` (seed, range, guesses, dense reward)."""
    return [{"prompt": "Play guess_number.", "env_config": {"seed": i, "reset_kwargs": {
        "low": low, "high": high, "max_attempts": max_attempts, "shaped": True, "reply": "number"}}} for i in range(n)]


def train(
    model: Any = "Qwen/Qwen2.5-0.5B-Instruct",
    env_url: str = "http://127.0.0.1:8000",
    rows: Sequence[dict[str, Any]] | None = None,
    *,
    actions: str = "tools",
    steps: int = 100,
    prompts_per_step: int = 4,
    num_generations: int = 8,
    max_turns: int = 6,
    max_tokens: int = 64,
    learning_rate: float = 1e-6,
    seed: int = 0,
    on_step: Callable[[int, list[Any], dict[str, float]], None] | None = None,
    ray: bool = False,
    model_workers: int = 2,
    sampler_workers: int = 2,
    device: str = "cpu",
) -> list[dict[str, float]]:
    """Run the loop for ``steps`` optimizer steps; returns each step's metrics. ``on_step(step,
    trajectories, metrics)`` sees every step's episodes. ``ray``: ``model`` (a path) trained
    data-parallel on ``model_workers`` Ray actors, sampled by ``sampler_workers`` more."""
    import torch

    torch.manual_seed(seed)
    rows = list(rows) if rows is not None else episodes()
    if ray and not isinstance(model, str):
        raise rlcore.ConfigError("--ray: every worker loads its own copy; pass the model's path or hub id")
    # seed: twinkle.initialize(mode='ray', groups=[DeviceGroup('model', ...), DeviceGroup('sampler', ...)])
    #       rlcore: the same with --ray; else everything in this process (remote_group= is then ignored)
    if ray:
        initialize(mode="ray", groups=[DeviceGroup("model", num_workers=model_workers, device=device),
                                       DeviceGroup("sampler", num_workers=sampler_workers, device=device)])
    else:
        initialize(mode="local")
    # seed: model = TransformersModel(model_id, remote_group='model'); model.set_loss('GRPOLoss'); set_optimizer(...)
    started = time.perf_counter()
    progress(f"loading {model if isinstance(model, str) else type(model).__name__} …")
    policy = Policy(model, loss="grpo", epsilon=0.2, beta=0.0, learning_rate=learning_rate, remote_group="model")
    # seed: sampler = vLLMSampler(model_id, remote_group='sampler')  — the hf sampler: on the group with
    #       --ray, else colocated with the policy's own module
    if ray:
        sampler = make_sampler("hf", model, remote_group="sampler", seed=seed)
    else:
        sampler = make_sampler("hf", policy.model, policy.tokenizer, seed=seed)
    # seed: sampling_params = SamplingParams(max_tokens=..., logprobs=1)
    sampling_params = SamplingParams(max_tokens=max_tokens, logprobs=1, stop=[" ", "\n"] if actions == "text" else [])
    # seed: rollout = MultiTurnRollout(sampler, sampling_params, max_turns=6)
    #       each trajectory gets its own ToolManager with an EnvTool on its own server session
    rollout = MultiTurnRollout(sampler, sampling_params, scheduler=SCHEDULERS[actions], max_turns=max_turns,
                               env_url=env_url, **({"stop_on_truncation": False} if actions == "text" else {}))
    # seed: rewards = [sum(env_tool.rewards) for env_tool in ...]  — openenv_reward is that sum
    reward_fn = Rewards(["openenv_reward"])
    # seed: advantage_fn = GRPOAdvantage()
    advantage_fn = rlcore.get("advantage", "grpo")()

    history: list[dict[str, float]] = []
    try:
        progress(f"loaded in {time.perf_counter() - started:.0f}s; {steps} steps of {prompts_per_step} prompts × "
                 f"{num_generations} episodes (up to {max_turns} turns of {max_tokens} tokens)")
        for step in range(steps):
            step_started = time.perf_counter()
            progress(f"step {step + 1}/{steps}: playing {prompts_per_step * num_generations} episodes, then scoring "
                     "and one optimizer step …")
            # seed: batch = next(dataloader); trajectories = [Trajectory(messages=..., tools=EnvTools(...)) ...]
            batch_rows = [rows[(step * prompts_per_step + i) % len(rows)] for i in range(prompts_per_step)]
            prompts = make_prompts(batch_rows, policy.tokenizer)
            # seed: ckpt_manager.sync_weights()
            sync_weights(policy, sampler)
            # seed: trajectories = rollout(trajectories)  (num_generations copies of each)
            trajectories = rollout(prompts, num_generations=num_generations)
            # seed: rewards read from the env tools of each trajectory
            scores = reward_fn(trajectories)
            # seed: advantages = GRPOAdvantage()(rewards, num_generations=8, scale='group')
            advantages = advantage_fn(scores, num_generations=num_generations, scale="group")
            # seed: model.forward_backward(inputs=trajectories, advantages=advantages)  (one pass: old_logps=None)
            metrics = policy.forward_backward(inputs=trajectories, advantages=advantages)
            # seed: model.clip_grad_and_step()
            metrics.update(policy.clip_grad_and_step())
            valid = [s for s in scores if s is not None]
            metrics.update(step=step + 1, reward=sum(valid) / len(valid) if valid else float("nan"),
                           num_turns=sum(t.num_turns for t in trajectories) / len(trajectories),
                           failed=float(sum(t.status == "failed" for t in trajectories)),
                           seconds=time.perf_counter() - step_started)
            history.append(metrics)
            if on_step is not None:
                on_step(step, trajectories, metrics)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()
                              if k in ("step", "loss", "reward", "num_turns", "failed", "grad_norm", "seconds")}),
                  flush=True)
    finally:
        rollout.close()  # the env sessions
        if ray:
            shutdown()  # the groups' actors
    return history


def progress(line: str) -> None:
    """A progress line on stderr (stdout keeps one JSON line per step): on a CPU a real model's step
    takes minutes, and the loop printed nothing until the first one ended."""
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--env-url", default="http://127.0.0.1:8000")
    ap.add_argument("--actions", choices=sorted(SCHEDULERS), default="tools")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--learning-rate", type=float, default=1e-6)
    ap.add_argument("--ray", action="store_true", help="the seed's placement: a model group and a sampler group on Ray")
    ap.add_argument("--model-workers", type=int, default=2, help="--ray: data-parallel policy workers")
    ap.add_argument("--sampler-workers", type=int, default=2, help="--ray: sampler workers")
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="--ray: what each worker holds")
    a = ap.parse_args(argv)
    train(a.model, a.env_url, actions=a.actions, steps=a.steps, num_generations=a.num_generations,
          max_tokens=a.max_tokens, learning_rate=a.learning_rate, ray=a.ray, model_workers=a.model_workers,
          sampler_workers=a.sampler_workers, device=a.device)


if __name__ == "__main__":
    main()
