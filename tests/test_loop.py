"""The loop API (rlcore.loop) on the real tiny model: sampling, rewards and advantages called
directly, Policy.forward_backward / clip_grad_and_step / save / load, and sync_weights to a
colocated, a separate in-process, and an HTTP (vLLM-dialect server) sampler, LoRA merged or not."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import rlcore
from rlcore import SamplingParams
from rlcore.algorithms.advantages import GRPOAdvantage, grpo_advantages
from rlcore.errors import ConfigError
from rlcore.loop import MultiTurnRollout, Policy, Rewards, Rollout, make_prompts, sample, sync_weights
from rlcore.data.tasks import digits_dataset


def _hf(model: Any, tok: Any = None, seed: int = 0) -> Any:
    return rlcore.get("sampler", "hf")(model, tok, seed=seed)


@pytest.fixture
def policy(tiny_model_dir: str) -> Policy:
    return Policy(tiny_model_dir, loss="grpo", learning_rate=1e-3)


def test_sampler_sample_returns_ids_and_logprobs_per_sequence(policy: Policy) -> None:
    sampler = _hf(policy.model, policy.tokenizer)
    prompts = [p.prompt_ids for p in make_prompts(digits_dataset(2), policy.tokenizer)]
    out = sampler.sample(prompts, SamplingParams(max_tokens=5, n=3))
    assert len(out) == 2 and all(len(group) == 3 for group in out)
    for group in out:
        for c in group:
            assert 0 < len(c.token_ids) <= 5 and len(c.logprobs) == len(c.token_ids)
            assert all(lp is not None and lp <= 0.0 for lp in c.logprobs)


def test_sample_gives_trajectories_grouped_by_prompt(policy: Policy) -> None:
    sampler = _hf(policy.model, policy.tokenizer)
    trajs = sample(sampler, ["What is 2+2?", [{"role": "user", "content": "Say 7."}]], SamplingParams(max_tokens=4, n=3))
    assert len(trajs) == 6
    assert len({t.group_id for t in trajs[:3]}) == 1 and trajs[0].group_id != trajs[3].group_id
    assert all(t.status in ("ok", "truncated") and t.completion_ids and t.logprobs_complete for t in trajs)


def test_rollout_restores_train_mode_and_runs_named_scheduler(policy: Policy) -> None:
    sampler = _hf(policy.model, policy.tokenizer)
    policy.model.train()
    rollout = MultiTurnRollout(sampler, SamplingParams(max_tokens=3), max_turns=2)
    assert type(rollout.scheduler).__name__ == "MultiTurnScheduler" or rollout.scheduler.name == "multi_turn"
    trajs = rollout(make_prompts(digits_dataset(1), policy.tokenizer), num_generations=2)
    assert len(trajs) == 2 and policy.model.training
    assert rollout.last_stats["trajectories"] == 2 and rollout.last_stats["invariant_violations"] == 0
    with pytest.raises(ConfigError, match="built already"):
        Rollout(sampler, scheduler=rollout.scheduler, max_turns=3)


def test_advantage_estimators_are_callable() -> None:
    rewards = [1.0, 0.0, 0.5, 0.5, 2.0, None]
    got = GRPOAdvantage()(rewards, num_generations=3, scale="group")
    want, _ = grpo_advantages(rewards, ["0", "0", "0", "1", "1", "1"], "group")
    assert torch.equal(got, want)
    assert not torch.equal(GRPOAdvantage()(rewards, num_generations=3, scale="none"), got)
    assert rlcore.get("advantage", "rloo")()(rewards, groups=list("aaabbb")).shape == (6,)
    with pytest.raises(ConfigError, match="num_generations"):
        GRPOAdvantage()(rewards, num_generations=4)
    with pytest.raises(ConfigError, match="num_generations= .* or groups="):
        GRPOAdvantage()(rewards)


def test_rewards_on_trajectories_and_advantages_from_them(policy: Policy) -> None:
    sampler = _hf(policy.model, policy.tokenizer)
    trajs = Rollout(sampler, SamplingParams(max_tokens=4))(make_prompts(digits_dataset(2), policy.tokenizer), num_generations=2)

    def length(completion_ids: list[list[int]]) -> list[float]:
        return [float(len(ids)) for ids in completion_ids]

    rewards = Rewards(["length_penalty", length], weights=[1.0, 0.5])
    values = rewards(trajs)
    assert set(rewards.columns) == {"length_penalty", "length"}
    for t, v in zip(trajs, values):
        n = len(t.completion_ids)
        assert v == pytest.approx(-n / 1000.0 + 0.5 * n) and t.reward == v and t.rewards["length"] == n
    from_trajs = GRPOAdvantage()(trajs)  # rewards and groups read from the trajectories
    assert torch.equal(from_trajs, GRPOAdvantage()(values, num_generations=2))
    with pytest.raises(ConfigError, match="weights"):
        Rewards(["length_penalty"], weights=[1.0, 2.0])


def test_policy_step_moves_weights_and_checkpoint_roundtrip(policy: Policy, tmp_path: Any) -> None:
    sampler = _hf(policy.model, policy.tokenizer)
    trajs = sample(sampler, make_prompts(digits_dataset(2), policy.tokenizer), SamplingParams(max_tokens=4), num_generations=4)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5] * 2)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    metrics = policy.forward_backward(trajs, adv)
    assert {"loss", "policy_loss", "entropy", "clip_ratio/low", "num_tokens"} <= set(metrics)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.model.parameters())
    step = policy.clip_grad_and_step()
    assert step["grad_norm"] > 0 and step["learning_rate"] == pytest.approx(1e-3) and policy.step == 1
    assert all(p.grad is None for p in policy.model.parameters())
    assert any(not torch.equal(before[n], p) for n, p in policy.model.named_parameters())
    # a second pass over the same data: old logps from before the step make the ratio != 1
    old = policy.logprobs(trajs)
    assert old.shape == policy.batch(trajs, adv).completion_mask.shape
    policy.forward_backward(trajs, adv, old_logps=old)
    policy.clip_grad_and_step()
    path = policy.save(tmp_path / "ckpt")
    other = Policy(str(path), loss="grpo", learning_rate=1e-3)
    other.load(path)
    assert other.step == 2
    for (n, p), (_, q) in zip(policy.model.named_parameters(), other.model.named_parameters()):
        assert torch.equal(p, q), n
    assert other.optimizer.state_dict()["state"].keys() == policy.optimizer.state_dict()["state"].keys()
    with pytest.raises(ConfigError, match="advantages are missing"):
        policy.forward_backward(trajs)
    with pytest.raises(ConfigError, match="unknown options: epsilonn"):
        Policy(policy.model, policy.tokenizer, epsilonn=0.1)


def test_sync_weights_colocated_and_separate_sampler(policy: Policy, tiny_model_dir: str) -> None:
    shared = _hf(policy.model, policy.tokenizer)
    metrics = sync_weights(policy, shared)
    assert metrics["sync/shared"] == 1.0 and shared.policy_version == 0
    separate = _hf(tiny_model_dir)  # its own copy of the weights
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.01)
    policy.step = 3
    sync_weights(policy, separate)
    assert separate.policy_version == 3
    for n, p in policy.model.named_parameters():
        assert torch.equal(dict(separate.model.named_parameters())[n], p), n


def test_sync_weights_lora_merged_into_plain_sampler_and_over_http(tiny_model_dir: str) -> None:
    from rlcore.testing.openai_server import OpenAICompatServer

    policy = Policy(tiny_model_dir, loss="grpo", lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"],
                                                        "lora_dropout": 0.0}, beta=0.04)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        want = policy.model(input_ids=ids).logits
    plain = _hf(tiny_model_dir)
    sync_weights(policy, plain, version=1)
    with torch.no_grad():
        got = plain.model(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    # beta > 0 with LoRA: the reference is the base model (adapters off)
    assert policy.ref_model is None
    # the HTTP sampler (vLLM's OpenAI dialect, weights as files through /collective_rpc)
    with OpenAICompatServer(tiny_model_dir) as server:
        client = rlcore.get("sampler", "openai")(server.url, model="rlcore-tiny", tokenizer=policy.tokenizer)
        sync_weights(policy, client, version=2)
        assert server.weight_syncs >= 1 and client.policy_version == 2
        with torch.no_grad():
            served = server.sampler.model(input_ids=ids).logits
        assert torch.allclose(served, want, atol=1e-5)
        # the blocking batch API works over HTTP too: n completions with logprobs per prompt
        (group,) = client.sample([[5, 6, 7]], SamplingParams(max_tokens=3, n=2))
        assert len(group) == 2 and all(len(c.logprobs) == len(c.token_ids) > 0 for c in group)


def test_sync_weights_lora_adapters_only_to_a_sampler_with_adapters(tiny_model_dir: str) -> None:
    import copy

    policy = Policy(tiny_model_dir, loss="grpo", lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"],
                                                        "lora_dropout": 0.0})
    sampler = _hf(copy.deepcopy(policy.model), policy.tokenizer)  # its own copy, adapters included
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    weights, lora = policy.weights(sampler)
    assert lora and weights and all("lora_" in n for n in weights)  # adapters only: a few tensors, not the model
    sync_weights(policy, sampler, version=5)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.allclose(sampler.model(input_ids=ids).logits, policy.model(input_ids=ids).logits, atol=1e-6)
    assert sampler.policy_version == 5


def test_rollout_of_prepared_trajectories(policy: Policy) -> None:
    from rlcore.rollout.driver import make_trajectories

    sampler = _hf(policy.model, policy.tokenizer)
    prepared = make_trajectories(make_prompts(digits_dataset(2), policy.tokenizer), num_generations=2)
    prepared[0].infos["note"] = "mine"
    trajs = Rollout(sampler, SamplingParams(max_tokens=3))(trajectories=prepared)
    assert [t.uuid for t in trajs] == [t.uuid for t in prepared]
    assert trajs[0].infos["note"] == "mine" and all(t.completion_ids for t in trajs)
    with pytest.raises(ConfigError, match="prompts or trajectories"):
        Rollout(sampler)()


def test_policy_entropy_bonus_static_and_adaptive(tiny_model_dir: str, tmp_path: Any) -> None:
    """``Policy(entropy_coef=…)``: the loss is the loss plugin's minus coef × the mean entropy, with
    the entropy's gradient; adaptive control moves once per ``clip_grad_and_step`` (the optimizer
    step), on the entropy of every ``forward_backward`` since the last one, and survives save/load."""
    plain = Policy(tiny_model_dir, loss="grpo", learning_rate=1e-3)
    static = Policy(tiny_model_dir, loss="grpo", learning_rate=1e-3, entropy_coef=0.5)
    sampler = _hf(plain.model, plain.tokenizer)
    trajs = sample(sampler, make_prompts(digits_dataset(2), plain.tokenizer), SamplingParams(max_tokens=4), num_generations=4)
    adv = torch.zeros(8)  # no policy gradient: what moves the weights is the bonus alone
    m0 = plain.forward_backward(trajs, adv)
    m1 = static.forward_backward(trajs, adv)
    assert m1["loss"] == pytest.approx(m1["policy_loss"] - 0.5 * m1["entropy"], abs=1e-5)
    assert m0["loss"] == pytest.approx(m0["policy_loss"], abs=1e-7)
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0 for p in plain.model.parameters())
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in static.model.parameters())
    assert static.clip_grad_and_step()["entropy_coef"] == 0.5
    assert "entropy_coef" not in plain.clip_grad_and_step()

    entropy = m1["entropy"]
    adaptive = Policy(tiny_model_dir, loss="grpo", learning_rate=1e-3, use_adaptive_entropy=True, entropy_coef=0.1,
                      entropy_coef_delta=0.05, entropy_target=entropy + 1.0)
    first = adaptive.forward_backward(trajs, adv, loss_scale=0.5)
    assert first["loss"] == pytest.approx(first["policy_loss"], abs=1e-7)  # no measurement yet: gate closed
    adaptive.forward_backward(trajs, adv, loss_scale=0.5)  # two calls accumulate into one step
    assert adaptive.entropy_bonus.coef == 0.1  # nothing moves before the optimizer step
    assert adaptive.clip_grad_and_step()["entropy_coef"] == pytest.approx(0.15)  # one delta per step
    assert adaptive.entropy_bonus.last_entropy == pytest.approx(entropy, rel=1e-4)
    second = adaptive.forward_backward(trajs, adv)
    assert second["loss"] < second["policy_loss"] - 0.1 * entropy  # gate open, coefficient 0.15
    adaptive.clip_grad_and_step()
    path = adaptive.save(tmp_path / "ckpt")
    other = Policy(str(path), loss="grpo", learning_rate=1e-3, use_adaptive_entropy=True, entropy_coef=0.1,
                   entropy_coef_delta=0.05, entropy_target=entropy + 1.0)
    other.load(path)
    assert (other.entropy_bonus.coef, other.entropy_bonus.last_entropy) == (adaptive.entropy_bonus.coef,
                                                                             adaptive.entropy_bonus.last_entropy)
    with pytest.raises(ConfigError, match="^entropy_coef_min"):
        Policy(plain.model, plain.tokenizer, entropy_coef_min=0.5, entropy_coef_max=0.1)


class _RunsOnUnpickle:
    """A pickled object whose unpickling writes a file: stands for code in a handed-over checkpoint."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (open, (self.marker, "w"))


def test_policy_load_refuses_a_state_file_that_would_run_code(policy: Policy, tmp_path: Any) -> None:
    """``Policy.load`` reads ``policy_state.pt`` with ``weights_only=True``: a state file holding an
    object that runs code when unpickled is refused with one line, and the code never runs (the old
    ``weights_only=False`` load created the marker file)."""
    path = policy.save(tmp_path / "ckpt")
    marker = tmp_path / "ran"
    state = torch.load(f"{path}/policy_state.pt", weights_only=True)
    state["extra"] = _RunsOnUnpickle(str(marker))
    torch.save(state, f"{path}/policy_state.pt")
    other = Policy(str(path), loss="grpo", learning_rate=1e-3)
    with pytest.raises(ConfigError, match=r"policy_state\.pt holds something other than tensors and plain data"):
        other.load(path)
    assert not marker.exists()
