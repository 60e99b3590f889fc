"""A data-parallel policy group on Ray: ``Policy(remote_group=DeviceGroup("model", num_workers=2))``
computes what one process computes. The ranks hold different numbers of trajectories and tokens,
``scale_rewards="batch"`` needs the whole batch's reward std, and dapo's normaliser and grpo's
mean over sequences are whole-batch numbers, so a rank that normalised over its own share would
differ from the single process. One Ray instance for the module; three policy groups in all."""

from __future__ import annotations

import pytest
import torch

ray = pytest.importorskip("ray")

from rlcore import SamplingParams  # noqa: E402
from rlcore.algorithms.advantages import GRPOAdvantage  # noqa: E402
from rlcore.distributed import (  # noqa: E402
    DeviceGroup, RemotePolicy, WorkerFailedError, initialize, make_sampler, shutdown,
)
from rlcore.loop import Policy, Rollout, make_prompts, pack, sample, sync_weights  # noqa: E402
from rlcore.data.tasks import digits_dataset  # noqa: E402

# AdamW divides by sqrt(v) + eps: a large eps keeps float rounding in near-zero gradients (which the
# all-reduce adds in another order) from growing into a full step, so weights can agree to 1e-6
OPTS = dict(learning_rate=1e-2, adam_epsilon=1e-3, max_grad_norm=None)


@pytest.fixture(scope="module")
def groups():
    initialize(mode="ray", groups=[DeviceGroup("model", num_workers=2, num_cpus=0.5),
                                   DeviceGroup("sampler", num_workers=2, num_cpus=0.5)], num_cpus=4)
    yield
    shutdown()
    initialize(mode="local")
    ray.shutdown()


@pytest.fixture(scope="module")
def batches(tiny_model_dir):
    """Two steps' trajectories, sampled once by a local sampler: 7 and 5 trajectories (shares of
    4+3 and 3+2, of different lengths), rewards that differ within and across groups."""
    import rlcore

    policy = Policy(tiny_model_dir)
    sampler = rlcore.get("sampler", "hf")(policy.model, policy.tokenizer, seed=3)
    prompts = make_prompts(digits_dataset(3), policy.tokenizer)
    out = []
    for n, take in ((3, 7), (2, 5)):
        trajs = sample(sampler, prompts[:n], SamplingParams(max_tokens=8, temperature=1.0), num_generations=3)[:take]
        scores = [float(len(t.completion_ids) % 5) + 0.1 * i for i, t in enumerate(trajs)]
        out.append((trajs, scores, [t.group_id for t in trajs]))
    return out


def _advantages(scores, groups):
    return GRPOAdvantage()(scores, groups, scale="batch")


def _train(policy, batches):
    logs = []
    for step, (trajs, scores, groups) in enumerate(batches):
        adv = _advantages(scores, groups)
        if step == 0:
            fb = policy.forward_backward(trajs, adv)
        else:  # two calls accumulated into one step (loss_scale 1/2 each)
            half = len(trajs) // 2
            fb = policy.forward_backward(trajs[:half], adv[:half], loss_scale=0.5)
            policy.forward_backward(trajs[half:], adv[half:], loss_scale=0.5)
        logs.append({**fb, **policy.clip_grad_and_step()})
    return logs


def _gap(local, remote) -> float:
    theirs = remote.state_dict()
    return max((p.detach() - theirs[n]).abs().max().item() for n, p in local.model.named_parameters())


@pytest.mark.timeout(600)
def test_dapo_group_trains_like_one_process_and_resumes_after_a_dead_worker(groups, batches, tiny_model_dir, tmp_path):
    local = Policy(tiny_model_dir, loss="dapo", **OPTS)
    one = _train(local, batches)
    remote = Policy(tiny_model_dir, loss="dapo", **OPTS, remote_group="model")
    assert isinstance(remote, RemotePolicy) and remote.num_workers == 2
    two = _train(remote, batches[:1])
    ckpt = remote.save(tmp_path / "step1")  # rank 0 writes
    trajs, scores, gids = batches[1]
    adv = _advantages(scores, gids)
    half = len(trajs) // 2
    fb = remote.forward_backward(trajs[:half], adv[:half], loss_scale=0.5)
    remote.forward_backward(trajs[half:], adv[half:], loss_scale=0.5)
    two.append({**fb, **remote.clip_grad_and_step()})
    assert one[0]["grad_norm"] > 0 and remote.step == 2
    start = Policy(tiny_model_dir)
    assert max((p.detach() - q.detach()).abs().max().item()
               for p, q in zip(start.model.parameters(), local.model.parameters())) > 1e-3  # it trained
    moved = _gap(local, remote)
    assert moved < 1e-6, f"weights differ by {moved} between a 2-worker group and one process"
    sums = remote.checksums()
    assert sums[0] == sums[1]  # both ranks stepped with the same (averaged) gradient
    for a, b in zip(one, two):
        for key in ("loss", "policy_loss", "num_tokens", "entropy", "grad_norm", "clip_ratio/region"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    first = batches[0][0]  # logprobs: each rank scores its share, the rows come back in order
    assert torch.allclose(remote.logprobs(first), local.logprobs(first), atol=1e-5)

    # a policy worker dies: the step fails with one line, the group stays stopped ...
    ray.kill(remote.actors[1], no_restart=True)
    with pytest.raises(WorkerFailedError, match=r"^policy worker 1 of group 'model' died during forward_backward .*"
                                                r"load the last checkpoint") as info:
        remote.forward_backward(trajs, adv)
    assert "\n" not in str(info.value)
    with pytest.raises(WorkerFailedError, match="died during forward_backward"):
        remote.clip_grad_and_step()
    # ... and the run resumes from its last checkpoint: the same weights as never having failed
    resumed = Policy(tiny_model_dir, loss="dapo", **OPTS, remote_group="model")
    resumed.load(ckpt)
    assert resumed.step == 1
    resumed.forward_backward(trajs[:half], adv[:half], loss_scale=0.5)
    resumed.forward_backward(trajs[half:], adv[half:], loss_scale=0.5)
    resumed.clip_grad_and_step()
    assert resumed.step == 2 and _gap(local, resumed) < 1e-6
    resumed.close()


@pytest.mark.timeout(600)
def test_lora_grpo_group_starts_from_rank_zero_and_trains_like_one_process(groups, batches, tiny_model_dir, tmp_path):
    """grpo's mean over sequences (shares of 4 and 3 rows), LoRA's random init taken from rank 0,
    and a checkpoint rank 0 writes loaded by one process."""
    lora = {"r": 8, "lora_dropout": 0.0}  # LoRA's dropout draws other masks in every process
    remote = Policy(tiny_model_dir, loss="grpo", lora=lora, **OPTS, remote_group="model")
    first = remote.checksums()
    assert first[0] == first[1]  # LoRA's random A matrices: rank 1 took rank 0's
    init = remote.save(tmp_path / "init")
    assert (tmp_path / "init" / "adapter_model.safetensors").exists()
    local = Policy(tiny_model_dir, loss="grpo", lora=lora, **OPTS)
    local.load(init)  # the same starting adapters
    one, two = _train(local, batches), _train(remote, batches)
    assert one[0]["grad_norm"] > 0
    moved = _gap(local, remote)
    assert moved < 1e-6, f"LoRA weights differ by {moved} between a 2-worker group and one process"
    for a, b in zip(one, two):
        for key in ("loss", "policy_loss", "entropy", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    remote.close()


@pytest.mark.timeout(600)
def test_policy_group_syncs_to_a_sampler_group_by_broadcast(groups, batches, tiny_model_dir):
    """Group to group: rank 0 sends once, over a gloo broadcast group (NCCL on GPUs) formed at the
    first sync and kept for the next, in buckets; both samplers then sample with the policy's weights."""
    policy = Policy(tiny_model_dir, loss="dapo", **OPTS, remote_group="model")
    sampler = make_sampler("hf", tiny_model_dir, remote_group="sampler", seed=0, weight_sync="broadcast",
                           bucket_bytes=256 * 1024)
    _train(policy, batches[:1])
    rollout = Rollout(sampler, SamplingParams(max_tokens=6))
    prompts = make_prompts(digits_dataset(4), policy.tokenizer)
    for version in (1, 2):
        m = sync_weights(policy, sampler)
        assert m["sync/broadcast"] == 1.0 and m["sync/workers"] == 2 and m["sync/buckets"] > 1
        assert sampler.policy_version == version == policy.step
        trajs = rollout(prompts, num_generations=2)
        assert {t.policy_version for t in trajs} == {version}
        batch = pack(trajs, [0.0] * len(trajs), policy.pad_token_id)
        mask = batch.completion_mask.bool()
        gap = float((policy.logprobs(trajs)[mask] - batch.sampler_logps[mask]).abs().max())
        assert gap < 1e-3, f"the samplers do not hold the policy's weights (gap {gap})"
        _train(policy, batches[1:])
    assert {i["policy_version"] for i in sampler.infos()} == {2}
    policy.close()


def _token_spread(completion_ids):
    return [float(sum(ids) % 13) / 13.0 for ids in completion_ids]


@pytest.mark.timeout(600)
def test_gsm8k_loop_example_runs_with_ray_groups(groups, tiny_model_dir, tmp_path):
    """examples/gsm8k/loop.py --ray: DeviceGroup("model", num_workers=2) and DeviceGroup("sampler",
    num_workers=2) on CPU actors, the loop's calls unchanged; rank 0 saves at the end."""
    from pathlib import Path

    from rlcore.testing import load_script

    example = load_script(Path(__file__).resolve().parents[1] / "examples" / "gsm8k" / "loop.py")
    rows = example.load_gsm8k(limit=2)
    history = example.train(tiny_model_dir, rows, steps=2, prompts_per_step=2, num_generations=2, max_tokens=6,
                            max_prompt_length=256, learning_rate=1e-3, rewards=(_token_spread,), seed=1,
                            save_to=str(tmp_path / "final"), ray=True, model_workers=2, sampler_workers=2)
    assert [h["step"] for h in history] == [1, 2]
    assert all(h["num_tokens"] > 0 for h in history) and any(h["grad_norm"] > 0 for h in history)
    assert (tmp_path / "final" / "model.safetensors").exists() and (tmp_path / "final" / "policy_state.pt").exists()
