"""Ray placement on a real local cluster: sampler actors serving rollouts of the tiny model, weight
sync through the object store, sticky routing, worker death. One Ray instance for the module."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

ray = pytest.importorskip("ray")

from rlcore.distributed import DistributedConfig, WorkerFailedError, WorkerGroupConfig  # noqa: E402
from rlcore.distributed.cluster import start_samplers  # noqa: E402
from rlcore.distributed.routing import bind_trajectory  # noqa: E402
from rlcore.distributed.runtime import ensure_ray  # noqa: E402
from rlcore.rollout import RolloutScheduler, run_rollouts  # noqa: E402
from rlcore.testing.multi_turn import AskAgain  # noqa: E402
from rlcore.types import Prompt, SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    """A local Ray instance with two sampler actors (half a CPU each) hosting the tiny model."""
    cfg = DistributedConfig(
        trainer=WorkerGroupConfig(num_workers=1, num_cpus=0.5),
        sampler=WorkerGroupConfig(num_workers=2, num_cpus=0.5),
        worker_timeout_s=120,
    )
    ensure_ray(num_cpus=4)
    placed, pool = start_samplers(cfg, tiny_model_dir, seed=0)
    yield cfg, placed, pool
    placed.remove()
    ray.shutdown()


class RecordingScheduler(AskAgain):
    """Asks again until max_turns regardless of length stops; records which sampler worker served each turn."""

    def on_turn_end(self, infer_request, response_choice, current_turn):
        return {"infos": {"workers": infer_request.infos.get("workers", []) + [response_choice.meta["sampler_worker"]]}}


def _prompts(tokenizer, n):
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"count to {i + 2}"}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(Prompt(messages=msgs, prompt_ids=tokenizer.encode(text, add_special_tokens=False)))
    return out


def _local_logprobs(model, prompt_ids, completion_ids):
    import torch

    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    lp = torch.log_softmax(logits, -1)
    return lp.gather(-1, torch.tensor(completion_ids).unsqueeze(-1)).squeeze(-1).tolist()


async def test_rollout_spreads_trajectories_and_sticks_per_trajectory(cluster):
    _, _, pool = cluster
    before = {i["rank"]: i["requests"] for i in pool.infos()}
    sched = RecordingScheduler(pool, max_turns=3, sampling_params=SamplingParams(max_tokens=4, temperature=1.0))
    result = await run_rollouts(sched, _prompts(pool.tokenizer, 4), num_generations=2, progress=False)
    trajs = result.trajectories
    assert len(trajs) == 8 and all(t.status in ("ok", "truncated") for t in trajs), [t.reason for t in trajs]
    for t in trajs:  # every turn of a trajectory went to the same worker
        assert len(t.infos["workers"]) == 3 and len(set(t.infos["workers"])) == 1, t.infos
    served = {t.infos["workers"][0] for t in trajs}
    assert served == {0, 1}  # least-loaded spreading used both workers
    after = {i["rank"]: i["requests"] for i in pool.infos()}
    assert all(after[r] - before[r] >= 6 for r in (0, 1)), (before, after)


async def test_weight_sync_reaches_every_sampler(cluster, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    _, _, pool = cluster
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompt = _prompts(pool.tokenizer, 1)[0].prompt_ids
    params = SamplingParams(max_tokens=5, temperature=1.0, seed=7)

    async def sample_each():
        return [await w.generate.remote(prompt, params) for w in pool.workers]

    for c in await sample_each():  # before: the samplers hold the original weights
        assert c.logprobs == pytest.approx(_local_logprobs(model, prompt, c.token_ids), abs=1e-4)
    v0 = pool.policy_version
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    metrics = await pool.update_weights_async(dict(model.named_parameters()))
    assert metrics["sync/seconds"] > 0 and metrics["sync/workers"] == 2 and metrics["sync/bytes"] > 0
    assert pool.policy_version == v0 + 1
    after = await sample_each()
    for c in after:  # after: their logprobs are those of the locally updated model
        assert c.meta["policy_version"] == v0 + 1
        assert c.logprobs == pytest.approx(_local_logprobs(model, prompt, c.token_ids), abs=1e-4)
    assert {i["policy_version"] for i in pool.infos()} == {v0 + 1}


async def test_bucketed_broadcast_sync_reaches_every_sampler(cluster, tiny_model_dir):
    """The broadcast path (NCCL on GPUs, gloo here) in buckets of 64 KiB: many broadcasts, one
    version, and both samplers then generate with exactly the sent weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.distributed.collective import bucket_plan, specs_of
    from rlcore.distributed.pool import RemoteSampler

    _, _, shared = cluster
    pool = RemoteSampler(shared.workers, shared.tokenizer, timeout_s=120)  # its own broadcast group
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    named = dict(model.named_parameters())
    plan = bucket_plan(specs_of(list(named.items())), 64 * 1024)
    assert len(plan) > 3 and all(sum(int(torch.tensor(s[1]).prod()) * 4 for s in g) <= 64 * 1024 or len(g) == 1
                                 for _, g in plan)
    pool.setup_broadcast("gloo", bucket_bytes=64 * 1024)
    metrics = await pool.update_weights_async(named, version=41)
    assert metrics["sync/broadcast"] == 1.0 and metrics["sync/buckets"] == len(plan) and metrics["sync/workers"] == 2
    prompt = _prompts(pool.tokenizer, 1)[0].prompt_ids
    params = SamplingParams(max_tokens=5, temperature=1.0, seed=3)
    for w in pool.workers:
        c = await w.generate.remote(prompt, params)
        assert c.meta["policy_version"] == 41
        assert c.logprobs == pytest.approx(_local_logprobs(model, prompt, c.token_ids), abs=1e-4)


async def test_bound_trajectory_uuid_is_sticky(cluster):
    _, _, pool = cluster
    ids = _prompts(pool.tokenizer, 1)[0].prompt_ids
    params = SamplingParams(max_tokens=2)

    async def one(uuid):
        with bind_trajectory(uuid):
            return [(await pool.generate(ids, params)).meta["sampler_worker"] for _ in range(3)]

    workers = await asyncio.gather(*(one(f"traj-{i}") for i in range(4)))
    assert all(len(set(w)) == 1 for w in workers)
    assert {w[0] for w in workers} == {0, 1}


class SeededScheduler(RolloutScheduler):
    """Deterministic rollouts whichever worker serves them: trajectory i of a batch samples with
    seed 1000 + i (a sampled token depends only on its seed and the logits)."""

    def on_trajectory_start(self, trajectories):
        for i, t in enumerate(trajectories):
            t.data["_seed"] = 1000 + i

    async def generate(self, trajectory, params=None, **kwargs):
        params = (params or self.sampling_params).replace(seed=trajectory.data["_seed"])
        return await super().generate(trajectory, params, **kwargs)


def digit_sum_mod7(completion_ids):
    """A reward that differs between completions, so advantages (and gradients) are not zero."""
    return [float(sum(c) % 7) for c in completion_ids]


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this module

ROWS = [{"prompt": f"What is {i} + {i + 1}?"} for i in range(8)]


def _grpo_args(out, **kw):
    from rlcore.training.config import GRPOConfig

    base = dict(output_dir=str(out), max_steps=2, per_device_train_batch_size=4, num_generations=4,
                max_completion_length=6, learning_rate=1e-3, seed=0, loss_type="dr_grpo", report_to=[],
                save_strategy="no", plots=False, use_cpu=True, disable_tqdm=True)
    base.update(kw)
    return GRPOConfig(**base)


def _train_config(num_trainers, **kw):
    return DistributedConfig(
        trainer=WorkerGroupConfig(num_workers=num_trainers, num_cpus=0.5),
        sampler=WorkerGroupConfig(num_workers=2, num_cpus=0.5),
        worker_timeout_s=120, **kw,
    )


def test_one_trainer_two_samplers_match_single_process(cluster, tiny_model_dir, tmp_path):
    from rlcore.distributed.runner import run_distributed
    from rlcore.trainer.grpo import GRPOTrainer

    _, placed, pool = cluster
    single = GRPOTrainer(tiny_model_dir, reward_funcs=[digit_sum_mod7], args=_grpo_args(tmp_path / "single"),
                         train_dataset=ROWS, scheduler=SeededScheduler(), prompt_column="prompt")
    single.train()
    ref = [h for h in single.state.log_history if "loss" in h]
    result = run_distributed(tiny_model_dir, _grpo_args(tmp_path / "ray"), ROWS, _train_config(1, weight_sync="broadcast"),
                             reward_funcs=[digit_sum_mod7], scheduler=SeededScheduler(), prompt_column="prompt",
                             progress=False, samplers=(placed, pool))
    got = [h for h in result.log_history if "loss" in h]
    assert result.global_step == 2 and len(got) == 2
    assert ref[0]["grad_norm"] > 0  # a real gradient, not a trivially equal zero
    for a, b in zip(ref, got):  # step 1, and step 2 after a weight sync to the samplers
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        assert b["reward"] == pytest.approx(a["reward"], abs=1e-6)
    # weights went over the gloo broadcast group (NCCL on GPU); step 2 matching proves they arrived
    assert len(result.sync_history) == 2 and all(m["sync/seconds"] > 0 and m["sync/broadcast"] == 1.0
                                                   for m in result.sync_history)
    assert "sync/seconds" in got[0]


def test_async_generation_with_two_data_parallel_trainers(cluster, tiny_model_dir, tmp_path):
    from rlcore.distributed.runner import run_distributed

    _, placed, pool = cluster
    result = run_distributed(tiny_model_dir, _grpo_args(tmp_path / "async", max_steps=3), ROWS,
                             _train_config(2, async_generation=True, max_staleness=1),
                             reward_funcs=[digit_sum_mod7], prompt_column="prompt", progress=False,
                             samplers=(placed, pool))
    assert result.global_step == 3
    logs = [h for h in result.log_history if "loss" in h]
    assert all(h["async/dropped_stale"] == 0 for h in logs)  # one batch ahead = lag 1 <= max_staleness
    assert max(h["async/max_lag"] for h in logs) == 1  # steps 2 and 3 trained on prefetched rollouts
    # IS correction against the sampler's logprobs is on, and sees the one-version lag
    assert all("is_ratio/mean" in h for h in logs)
    assert any(abs(h["is_ratio/mean"] - 1.0) > 1e-6 for h in logs[1:])
    assert all(m["sync/broadcast"] == 0.0 for m in result.sync_history)  # the object-store path
    sums = [r["param_checksum"] for r in result.ranks]
    assert len(sums) == 2 and sums[0] == pytest.approx(sums[1], rel=0, abs=1e-9)  # gradients all-reduced


def test_killed_trainer_worker_fails_the_run_clearly(cluster, tiny_model_dir, tmp_path):
    """Documented behaviour: a dead trainer rank stops the run with WorkerFailedError naming it."""
    import threading

    from rlcore.distributed.runner import run_distributed

    _, placed, pool = cluster

    def kill_after_first_step(trainers, _samplers):
        def killer():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if ray.get(trainers.actors[0].progress.remote(), timeout=5)["global_step"] >= 1:
                        break
                except Exception:  # noqa: BLE001
                    return
                time.sleep(0.2)
            ray.kill(trainers.actors[0], no_restart=True)

        threading.Thread(target=killer, daemon=True).start()

    t0 = time.perf_counter()
    with pytest.raises(WorkerFailedError, match=r"trainer worker 0 died during train .*resume"):
        run_distributed(tiny_model_dir, _grpo_args(tmp_path / "kill", max_steps=200), ROWS, _train_config(1),
                        reward_funcs=[digit_sum_mod7], prompt_column="prompt", progress=False,
                        samplers=(placed, pool), on_started=kill_after_first_step)
    assert time.perf_counter() - t0 < 120


def test_rlcore_train_distributed_ray_cli(cluster, tmp_path, capsys):
    """The command line end to end: its own sampler group on the running Ray instance."""
    import json

    from rlcore.commands.cli import main

    out = tmp_path / "cli"
    main(["train", "--distributed", "ray", "--num-trainer-workers", "1", "--num-sampler-workers", "1",
          "--cpus-per-worker", "0.5", "--worker-device", "cpu", "--max-steps", "2",
          "--per-device-train-batch-size", "8", "--output-dir", str(out), "--plots", "false"])
    printed = capsys.readouterr().out
    assert "1 trainer + 1 sampler workers on cpu" in printed and "weight sync" in printed
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2] and all("sync/seconds" in x for x in lines)


def test_adaptive_entropy_moves_on_the_world_mean_across_trainer_ranks(cluster, tiny_model_dir, tmp_path):
    """Two data-parallel trainers see different prompts (so different entropies) yet measure one
    world-mean entropy at every optimizer step and hold the same adaptive coefficient (TRL
    reduces the window's entropy sum and token count over processes)."""
    from rlcore.distributed.runner import run_distributed

    _, placed, pool = cluster
    args = _grpo_args(tmp_path / "entropy", max_steps=2, use_adaptive_entropy=True, entropy_coef=0.1,
                      entropy_coef_delta=0.05, entropy_target=100.0)
    result = run_distributed(tiny_model_dir, args, ROWS, _train_config(2), reward_funcs=[digit_sum_mod7],
                             prompt_column="prompt", progress=False, samplers=(placed, pool))
    assert result.global_step == 2
    ctrl = [r["entropy_control"] for r in result.ranks]
    assert len(ctrl) == 2 and all(c is not None for c in ctrl)
    assert ctrl[0]["entropy_coef"] == ctrl[1]["entropy_coef"] == pytest.approx(0.2)  # +delta at each of 2 steps
    assert 0 < ctrl[0]["last_world_entropy"] == ctrl[1]["last_world_entropy"]
    sums = [r["param_checksum"] for r in result.ranks]
    assert sums[0] == pytest.approx(sums[1], rel=0, abs=1e-9)


class SeededAskAgain(SeededScheduler, AskAgain):
    """Three seeded turns: asks again whatever the reply (deterministic on any worker)."""

    default_max_turns = 3


def test_per_turn_samples_train_on_ray_as_in_one_process(cluster, tiny_model_dir, tmp_path):
    """A chat template that rewrites history (a header counting the messages): every turn is a
    sample of its own (``multi_turn_mode`` auto). One trainer and two sampler workers on Ray train
    the same per-turn rows as one process: the same loss, gradient norm and sample counts."""
    from rlcore.distributed.runner import run_distributed
    from rlcore.trainer.grpo import GRPOTrainer
    from transformers import AutoTokenizer

    template = tmp_path / "counting.jinja"
    template.write_text("{{ messages | length }} messages\n" + AutoTokenizer.from_pretrained(tiny_model_dir).chat_template)
    kw = dict(chat_template=str(template), max_completion_length=4)
    _, placed, pool = cluster
    single = GRPOTrainer(tiny_model_dir, reward_funcs=[digit_sum_mod7], args=_grpo_args(tmp_path / "single", **kw),
                         train_dataset=ROWS, scheduler=SeededAskAgain(), prompt_column="prompt")
    single.train()
    ref = [h for h in single.state.log_history if "loss" in h]
    result = run_distributed(tiny_model_dir, _grpo_args(tmp_path / "ray", **kw), ROWS, _train_config(1),
                             reward_funcs=[digit_sum_mod7], scheduler=SeededAskAgain(), prompt_column="prompt",
                             progress=False, samplers=(placed, pool))
    got = [h for h in result.log_history if "loss" in h]
    assert len(ref) == len(got) == 2 and ref[0]["grad_norm"] > 0
    for a, b in zip(ref, got):
        assert a["num_turns"] == 3 and a["samples"] == a["episodes"] * 3, a  # per-turn rows in both runs
        assert (b["samples"], b["episodes"], b["failed_trajectories"]) == (a["samples"], a["episodes"], 0)
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)


async def _kill_when_busy(pool, placed, idx, timeout=60.0):
    """Kill sampler worker ``idx`` while requests are in flight on it (mid-rollout)."""
    deadline = time.monotonic() + timeout
    while pool.router.inflight[idx] == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert pool.router.inflight[idx] > 0, "worker never got a request"
    await asyncio.sleep(0.05)
    ray.kill(placed.actors[idx], no_restart=True)
    return pool.router.inflight[idx]


async def test_killed_sampler_worker_mid_rollout_loses_no_trajectory(cluster):
    """Documented behaviour: a sampler that dies mid-rollout has its in-flight trajectories retried
    on the survivors, once each; a trajectory that loses a second worker (or finds none left)
    ends failed with the reason — every trajectory comes back, none is lost silently, nothing
    hangs. Keep this test last in the file: it kills the module's shared sampler workers."""
    _, placed, pool = cluster
    params = SamplingParams(max_tokens=24, temperature=1.0)
    sched = RecordingScheduler(pool, max_turns=2, sampling_params=params)
    rollout = asyncio.ensure_future(run_rollouts(sched, _prompts(pool.tokenizer, 4), num_generations=2, progress=False))
    in_flight = await _kill_when_busy(pool, placed, 1)
    result = await rollout
    trajs = result.trajectories
    assert len(trajs) == 8 and in_flight > 0
    assert all(t.status in ("ok", "truncated") for t in trajs), [t.reason for t in trajs]
    assert pool.alive_workers == [0] and 1 in pool.dead
    assert pool.retries >= in_flight  # every request the dead worker held moved to the survivor
    assert all(t.infos["workers"][-1] == 0 for t in trajs if 1 in t.infos["workers"])  # and finished there
    # the survivor dies too, mid-rollout: each trajectory ends failed with a reason (none dropped)
    rollout = asyncio.ensure_future(run_rollouts(sched, _prompts(pool.tokenizer, 2), num_generations=2, progress=False))
    t0 = time.perf_counter()
    await _kill_when_busy(pool, placed, 0)
    result = await rollout
    assert time.perf_counter() - t0 < 30
    assert len(result.trajectories) == 4
    assert all(t.status == "failed" and "sampler worker" in t.reason and "dead" in t.reason
               for t in result.trajectories), [t.reason for t in result.trajectories]
    with pytest.raises(WorkerFailedError, match="all 2 sampler workers are dead"):
        await pool.generate([1, 2, 3], SamplingParams(max_tokens=2))
