"""The loop API on a real local Ray cluster: ``initialize(mode="ray", groups=[...])``, a Policy and
a sampler pool on named groups, the loop's calls unchanged, weights synced from the policy's actor."""

from __future__ import annotations

import pytest
import torch

ray = pytest.importorskip("ray")

from rlcore import SamplingParams  # noqa: E402
from rlcore.errors import ConfigError  # noqa: E402
from rlcore.distributed import DeviceGroup, RemotePolicy, initialize, make_sampler, shutdown  # noqa: E402
from rlcore.loop import Policy, Rewards, Rollout, make_prompts, pack, sync_weights  # noqa: E402
from rlcore.algorithms.advantages import GRPOAdvantage  # noqa: E402
from rlcore.data.tasks import digits_dataset  # noqa: E402


def _gap(policy, trajs) -> float:
    """Largest |sampler logprob - policy logprob| over the sampled tokens."""
    batch = pack(trajs, [0.0] * len(trajs), policy.pad_token_id)
    lp = policy.logprobs(trajs)
    mask = batch.completion_mask.bool()
    return float((lp[mask] - batch.sampler_logps[mask]).abs().max())


@pytest.mark.timeout(600)
def test_policy_and_sampler_on_ray_groups(tiny_model_dir: str) -> None:
    initialize(mode="ray", groups=[DeviceGroup("model", num_cpus=1), DeviceGroup("sampler", num_cpus=0.5)], num_cpus=2)
    try:
        with pytest.raises(ConfigError, match="not one of the groups"):
            make_sampler("hf", tiny_model_dir, remote_group="trainer")
        policy = Policy(tiny_model_dir, loss="grpo", learning_rate=5e-2, remote_group="model")
        assert isinstance(policy, RemotePolicy) and policy.step == 0
        sampler = make_sampler("hf", tiny_model_dir, remote_group="sampler", seed=0)
        rollout = Rollout(sampler, SamplingParams(max_tokens=6))
        prompts = make_prompts(digits_dataset(2), policy.tokenizer)

        # one step of the loop, every call as in the local loop
        sync_weights(policy, sampler)
        trajs = rollout(prompts, num_generations=4)
        assert len(trajs) == 8 and all(t.status != "failed" for t in trajs)
        assert _gap(policy, trajs) < 1e-3  # the sampler actor generates with the policy's weights
        scores = Rewards(["length_penalty"])(trajs)
        advantages = GRPOAdvantage()(scores, num_generations=4)
        metrics = policy.forward_backward(trajs, advantages + torch.linspace(-1, 1, 8))
        assert metrics["num_tokens"] > 0
        assert policy.clip_grad_and_step()["grad_norm"] > 0 and policy.step == 1

        stale = rollout(prompts, num_generations=2)
        assert _gap(policy, stale) > 1e-3  # the policy moved; the sampler has not heard yet
        sync_weights(policy, sampler)  # the policy's actor sends to the pool (object store)
        assert sampler.policy_version == 1 and sampler.last_sync["sync/workers"] == 1.0
        fresh = rollout(prompts, num_generations=2)
        assert _gap(policy, fresh) < 1e-3
        # back to local placement: remote_group is ignored, the policy is built in this process
        initialize(mode="local")
        assert isinstance(Policy(tiny_model_dir, remote_group="model"), Policy)
    finally:
        shutdown()
        ray.shutdown()
