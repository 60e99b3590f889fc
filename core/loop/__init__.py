"""The training loop in your hands: the steps of GRPO as calls (Tinker / twinkle style).

    from rlcore.loop import Policy, Rewards, Rollout, make_prompts, sync_weights
    from rlcore.algorithms.advantages import GRPOAdvantage

    policy = Policy(model_path, loss="grpo", learning_rate=1e-6)
    sampler = rlcore.get("sampler", "hf")(policy.model, policy.tokenizer, seed=0)
    rollout = Rollout(sampler, SamplingParams(max_tokens=256))
    rewards = Rewards(["gsm8k_accuracy", "gsm8k_format"])
    for rows in batches:
        sync_weights(policy, sampler)
        trajectories = rollout(make_prompts(rows, policy.tokenizer), num_generations=8)
        advantages = GRPOAdvantage()(rewards(trajectories), num_generations=8, scale="group")
        policy.forward_backward(trajectories, advantages)
        policy.clip_grad_and_step()

``GRPOTrainer`` runs these same functions in its generation step and loss (see docs/loop.md).
Importing this package does not import torch; the names load on first use. Placement on Ray
(``initialize(mode="ray", groups=[...])``, ``Policy(..., remote_group=...)``, ``make_sampler``)
is in :mod:`rlcore.distributed`.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Policy": ".policy",
    "Rollout": ".rollouts",
    "MultiTurnRollout": ".rollouts",
    "rollout_batch": ".rollouts",
    "sample": ".rollouts",
    "as_prompts": ".rollouts",
    "make_prompts": ".prompts",
    "Rewards": ".scoring",
    "build_reward": ".scoring",
    "sync_weights": ".sync",
    "pack": ".loss",
    "batch_loss": ".loss",
    "batch_logprobs": ".loss",
    "advantage_list": ".loss",
    "set_placer": ".placer",
    "DynamicSampling": "..training.dynamic_sampling",
    "filter_groups": "..training.dynamic_sampling",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module 'rlcore.loop' has no attribute {name!r}")
