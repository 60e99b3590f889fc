"""DAPO's dynamic sampling (issue #31): with ``dynamic_sampling=True`` a step trains only on groups
whose rewards differ, drawing more prompts until it has ``prompts_per_generation`` of them (at most
``max_resample_rounds`` extra rounds); below ``min_groups`` the step is skipped, and
``failure_patience`` skipped steps in a row stop the run with one line naming the reward.

The reward is deterministic per row: an ``easy`` row scores 1.0 on every completion (a flat group,
no learning signal), a ``hard`` row alternates 0/1 within its group (spread), whatever the model says.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import rlcore  # noqa: E402
from rlcore.testing.spread import by_row, easy_and_hard_rows  # noqa: E402
from rlcore.errors import ConfigError, RunFailedError  # noqa: E402
from rlcore.testing.cli_checks import fails_before_model_load  # noqa: E402
from rlcore.training.dynamic_sampling import DynamicSampling, filter_groups  # noqa: E402
from rlcore.types import Trajectory  # noqa: E402


def rows(easy: int = 6, hard: int = 6) -> list[dict[str, Any]]:
    return easy_and_hard_rows(easy, hard)


def _args(out: str, **over: Any) -> Any:
    base = dict(output_dir=out, num_generations=2, per_device_train_batch_size=4, max_completion_length=2, max_steps=3,
                learning_rate=1e-3, save_strategy="no", report_to="none", plots=False, disable_tqdm=True, seed=3,
                dynamic_sampling=True, max_resample_rounds=4)
    return rlcore.GRPOConfig(**{**base, **over})


def trainer(out: str, data: list[dict[str, Any]] | None = None, **over: Any) -> Any:
    """A tiny-model trainer that records the rows each round drew and the groups each step trained."""
    from rlcore.data.demo import tiny_model_path

    t = rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=[by_row], args=_args(out, **over),
                           train_dataset=rows() if data is None else data)
    t.rounds_drawn, t.trained = [], []
    take, generate = t.prompt_sampler.take, t._generate_and_score

    def recording_take(k: int) -> list[int]:
        idx = take(k)
        t.rounds_drawn[-1].append([t.rows[i]["id"] for i in idx])
        return idx

    def recording_generate() -> Any:
        t.rounds_drawn.append([])
        out = generate()
        groups: dict[str, list[Any]] = {}
        for tr in t.whole_batch.trajectories:
            groups.setdefault(tr.group_id, []).append(tr)
        t.trained.append([(g[0].data["id"], [tr.reward for tr in g]) for g in groups.values()])
        return out

    t.prompt_sampler.take, t._generate_and_score = recording_take, recording_generate
    return t


def logged(t: Any) -> list[dict[str, Any]]:
    return [h for h in t.state.log_history if "dynamic_sampling/rounds" in h]


def test_every_trained_group_has_spread_and_the_batch_is_full(tmp_path: Any) -> None:
    t = trainer(str(tmp_path / "ds"), per_device_train_batch_size=8, log_completions=True,
                num_completions_to_print=0)  # 4 groups a step
    t.train()
    assert t.state.global_step == 3 and len(t.trained) == 3
    for step, (drawn, trained, log) in enumerate(zip(t.rounds_drawn, t.trained, logged(t))):
        flat_ids = [i for r in drawn for i in r if i.startswith("e")]
        spread_ids = [i for r in drawn for i in r if i.startswith("h")]
        assert len(trained) == 4, (step, drawn, trained)  # exactly prompts_per_generation groups
        assert all(max(rw) > min(rw) for _, rw in trained)  # every trained group has a learning signal
        assert [i for i, _ in trained] == spread_ids[:4]  # the first ones drawn; the surplus dropped
        assert log["dynamic_sampling/rounds"] == len(drawn) >= 1
        assert log["dynamic_sampling/filtered_groups"] == len(flat_ids)
        assert log["dynamic_sampling/kept_groups"] == 4
        assert log["dynamic_sampling/surplus_groups"] == len(spread_ids) - 4
        assert log["dynamic_sampling/generated_groups"] == len(flat_ids) + len(spread_ids)
        assert log["dynamic_sampling/tokens_per_kept_group"] == pytest.approx(log["sampled_tokens"] / 4)
        assert log["advantage_zero_std_frac"] == 0.0
        assert log["sampled_tokens"] == 2 * 2 * log["dynamic_sampling/generated_groups"]  # every round's tokens
        assert [len(r) for r in drawn][0] == 4  # the first round is the ordinary batch
    assert any(len(d) > 1 for d in t.rounds_drawn)  # refill rounds happened
    lines = [json.loads(x) for x in (tmp_path / "ds" / "metrics.jsonl").read_text().splitlines()]
    assert [x["dynamic_sampling/rounds"] for x in lines] == [len(d) for d in t.rounds_drawn]
    logged_completions = [json.loads(x) for x in (tmp_path / "ds" / "completions.jsonl").read_text().splitlines()]
    assert len(logged_completions) == 3 * 4 * 2  # the trained batch: 4 groups of 2 a step
    assert all(c["prompt"].startswith("hard") and c["advantage"] != 0 for c in logged_completions)


def test_without_dynamic_sampling_flat_groups_train(tmp_path: Any) -> None:
    t = trainer(str(tmp_path / "plain"), per_device_train_batch_size=8, dynamic_sampling=False)
    t.train()
    assert all(len(d) == 1 for d in t.rounds_drawn) and not logged(t)
    assert any(max(rw) == min(rw) for step in t.trained for _, rw in step)


def test_the_bound_trains_a_smaller_batch_at_min_groups(tmp_path: Any) -> None:
    """One hard row among six: the two rounds a step may draw (max_resample_rounds=1) hold eight
    prompts, so at least one and at most two groups with spread of the four it wants; min_groups=1
    trains on what it found."""
    t = trainer(str(tmp_path / "b"), data=rows(easy=5, hard=1), per_device_train_batch_size=8, max_resample_rounds=1,
                max_steps=2)
    t.train()
    for drawn, trained, log in zip(t.rounds_drawn, t.trained, logged(t)):
        assert len(drawn) == 2  # the first round and the one extra allowed
        hard = [i for r in drawn for i in r if i == "h0"]
        assert 1 <= len(trained) == len(hard) == log["dynamic_sampling/kept_groups"] < 4
        assert log["dynamic_sampling/skipped"] == 0.0


def test_below_min_groups_the_step_is_skipped_then_the_run_stops_naming_the_reward(tmp_path: Any) -> None:
    t = trainer(str(tmp_path / "flat"), data=rows(easy=6, hard=0), max_resample_rounds=2, failure_patience=2,
                max_steps=5, weight_decay=0.1)
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    with pytest.raises(RunFailedError) as exc:
        t.train()
    line = str(exc.value)
    assert "\n" not in line
    assert ("dynamic sampling found no learning signal: reward 'by_row' gave every completion of every group the same "
            "score for 6 rounds (2 steps in a row, 12 groups, max_resample_rounds=2; the flat groups scored 1)") in line
    assert "--max_resample_rounds" in line
    assert t.state.global_step == 1  # the first step was skipped: no update (weight decay would move every weight)
    assert all(torch.equal(before[n], p) for n, p in t.model.named_parameters())
    assert not t.optimizer.state  # AdamW saw no gradient: no moments either
    assert [len(d) for d in t.rounds_drawn] == [3, 3]
    first = [h for h in t.state.log_history if "dynamic_sampling/skipped" in h]
    assert first and first[0]["dynamic_sampling/skipped"] == 1.0 and first[0]["dynamic_sampling/kept_groups"] == 0


def test_min_groups_above_what_was_found_skips(tmp_path: Any) -> None:
    """Four rows, four prompts a step (one epoch): one group with spread per step, min_groups=2."""
    t = trainer(str(tmp_path / "m"), data=rows(easy=3, hard=1), per_device_train_batch_size=8, max_resample_rounds=0,
                min_groups=2, failure_patience=2, max_steps=3)
    with pytest.raises(RunFailedError, match=r"too little learning signal: only 2 of 8 groups had any spread in reward "
                                             r"'by_row' for 2 rounds .* fewer than min_groups=2 per step"):
        t.train()


def test_the_metric_can_name_one_reward(tmp_path: Any) -> None:
    """Two rewards: ``by_row`` has spread on hard rows, ``constant`` never does. The total has
    spread where by_row has; dynamic_sampling_metric='constant' finds none and says so."""
    from rlcore.data.demo import tiny_model_path

    def constant(completions: list[str]) -> list[float]:
        return [0.5] * len(completions)

    args = _args(str(tmp_path / "c"), dynamic_sampling_metric="constant", max_resample_rounds=0, failure_patience=1)
    t = rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=[by_row, constant], args=args, train_dataset=rows())
    with pytest.raises(RunFailedError, match=r"reward 'constant' gave every completion of every group the same score "
                                             r"for 1 rounds .*the flat groups scored 0.5\)"):
        t.train()
    with pytest.raises(ConfigError, match=r"dynamic_sampling_metric='accuracy' is not a reward of this run; use "
                                          r"'reward' \(the weighted total\) or one of: by_row, constant"):
        rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=[by_row, constant], train_dataset=rows(),
                           args=_args(str(tmp_path / "d"), dynamic_sampling_metric="accuracy"))


def test_difficulty_sampler_still_sees_filtered_groups(tmp_path: Any) -> None:
    t = trainer(str(tmp_path / "p"), prompt_sampler="difficulty", prompt_sampler_options={"window": 1}, max_steps=4)
    t.train()
    hist = t.prompt_sampler.history
    easy_seen = {int(i) for i in hist if t.rows[int(i)]["easy"]}
    assert easy_seen  # filtered (flat) groups were observed …
    drawn_easy = [i for d in t.rounds_drawn for r in d for i in r if i.startswith("e")]
    assert len(drawn_easy) == len(set(drawn_easy))  # … so the sampler never draws a solved prompt twice


def test_resumed_run_draws_and_trains_what_the_uninterrupted_one_did(tmp_path: Any) -> None:
    from rlcore.testing.runs import stop_at_step

    over = dict(max_steps=4, save_strategy="steps", save_steps=2, data=rows(easy=7, hard=3))

    whole = trainer(str(tmp_path / "whole"), **over)
    whole.train()
    first = trainer(str(tmp_path / "cut"), **over)
    first.add_callback(stop_at_step(2))
    first.train()
    second = trainer(str(tmp_path / "cut"), **over)
    second.train(resume_from_checkpoint=True)
    assert first.rounds_drawn + second.rounds_drawn == whole.rounds_drawn
    assert [[i for i, _ in s] for s in first.trained + second.trained] == [[i for i, _ in s] for s in whole.trained]
    assert any(len(d) > 1 for d in whole.rounds_drawn)
    a = [x["dynamic_sampling/rounds"] for x in map(json.loads, (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines())]
    b = [x["dynamic_sampling/rounds"] for x in map(json.loads, (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines())]
    assert a == b


def test_the_skip_streak_survives_a_resume(tmp_path: Any) -> None:
    """Two skipped steps, a checkpoint, a resume: the third skipped step in a row stops the run."""
    from rlcore.testing.runs import stop_at_step

    over = dict(data=rows(easy=4, hard=0), max_resample_rounds=0, failure_patience=3, max_steps=6,
                save_strategy="steps", save_steps=2)

    first = trainer(str(tmp_path / "s"), **over)
    first.add_callback(stop_at_step(2))
    first.train()
    state = json.loads((tmp_path / "s" / "checkpoint-2" / "rlcore_state.json").read_text())
    assert state["dynamic_sampling"]["steps"] == 2
    second = trainer(str(tmp_path / "s"), **over)
    with pytest.raises(RunFailedError, match=r"for 3 rounds \(3 steps in a row, 6 groups"):
        second.train(resume_from_checkpoint=True)


def test_flags_and_bad_values(tmp_path: Any, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlcore.commands.train import build_plan

    plan = build_plan(["--dynamic-sampling", "true", "--max-resample-rounds", "2", "--min-groups", "2",
                       "--dynamic-sampling-metric", "digits", "--output_dir", str(tmp_path / "t")])
    a = plan.args
    assert (a.dynamic_sampling, a.max_resample_rounds, a.min_groups, a.dynamic_sampling_metric) == \
        (True, 2, 2, "digits")  # the default task's reward
    err = fails_before_model_load(["--dynamic-sampling", "true", "--min-groups", "9", "--output-dir",
                                   str(tmp_path / "o")], capsys, monkeypatch)
    assert "min_groups must be an int from 1 to the 4 groups of a generation batch" in err
    err = fails_before_model_load(["--dynamic-sampling", "true", "--reward", "length_penalty", "--dynamic-sampling-metric",
                                   "accuracy", "--output-dir", str(tmp_path / "o")], capsys, monkeypatch)
    assert err == ("Error: dynamic_sampling_metric='accuracy' is not a reward of this run; use 'reward' (the weighted "
                   "total) or one of: length_penalty")
    with pytest.raises(ConfigError, match="needs num_generations >= 2"):
        _args(str(tmp_path / "g"), num_generations=1)
    with pytest.raises(ConfigError, match="max_resample_rounds must be an int >= 0"):
        _args(str(tmp_path / "r"), max_resample_rounds=-1)


def _traj(group: str, reward: float | None, status: str = "ok", **named: float) -> Trajectory:
    return Trajectory(prompt_ids=[1], group_id=group, reward=reward, status=status, rewards=dict(named))


def test_spread_rules_and_refill_sizes() -> None:
    trajs = [_traj("a", 1.0), _traj("a", 1.0), _traj("b", 0.0), _traj("b", 1.0),
             _traj("c", 1.0), _traj("c", 0.0, status="failed"), _traj("d", None), _traj("d", 2.0)]
    kept, flat = filter_groups(trajs)
    assert {t.group_id for t in kept} == {"b"} and {t.group_id for t in flat} == {"a", "c", "d"}
    ds = DynamicSampling(groups=8, max_resample_rounds=3)
    assert ds.next_draw() == 8
    ds.add([_traj(f"g{i}", float(j) if i < 2 else 1.0) for i in range(8) for j in range(2)])
    assert len(ds.kept) == 2 and ds.filtered == 6 and not ds.done
    assert ds.next_draw() == 8  # 6 missing at a rate of 1/4: 24 wanted, capped at one batch
    ds.add([_traj(f"h{i}", float(j)) for i in range(8) for j in range(2)])
    assert ds.done and ds.surplus == 2 and [g[0].group_id for g in ds.take()][:3] == ["g0", "g1", "h0"]
    ds = DynamicSampling(groups=8, max_resample_rounds=3)
    ds.add([_traj(f"g{i}", float(j) if i < 6 else 1.0) for i in range(8) for j in range(2)])
    assert ds.next_draw() == 3  # 2 missing at a rate of 3/4


def test_loop_api(tmp_path: Any) -> None:
    """The loop's DynamicSampling: rounds of make_prompts → Rollout → Rewards until the batch is full."""
    from rlcore.data.demo import tiny_model_path
    from rlcore.loop import DynamicSampling as LoopDS, Policy, Rewards, Rollout, make_prompts
    from rlcore.plugins import get
    from rlcore.types import SamplingParams

    policy = Policy(tiny_model_path(), loss="grpo", learning_rate=1e-3)
    sampler = get("sampler", "hf")(policy.model, policy.tokenizer, seed=0)
    rollout = Rollout(sampler, SamplingParams(max_tokens=2))
    rewards = Rewards([by_row])
    data = rows(easy=5, hard=3)
    pos = 0
    ds = LoopDS(groups=2, max_resample_rounds=5)
    while (n := ds.next_draw()):
        chunk = [data[(pos + i) % len(data)] for i in range(n)]
        pos += n
        trajs = rollout(make_prompts(chunk, policy.tokenizer), num_generations=2)
        rewards(trajs)
        ds.add(trajs)
    groups = ds.take()
    assert len(groups) == 2 and all(g[0].data["id"].startswith("h") for g in groups)
    # e0 e1 | e2 e3 | e4 h0 | h1 h2: four rounds, five flat groups, one group with spread left over
    assert ds.rounds == 4 and ds.filtered == 5 and ds.surplus == 1 and ds.metrics()["dynamic_sampling/rounds"] == 4.0


def test_two_ranks_keep_the_groups_one_process_keeps(tmp_path: Any) -> None:
    """torchrun, 2 ranks: every rank decides from every rank's groups, so both keep the same groups,
    train the same number each, and the run trains the groups a single process trains."""
    from pathlib import Path

    from rlcore.testing.runs import launch_ranks

    script = Path(__file__).with_name("dp_dynamic_sampling_run.py")
    got = {}
    for ranks in (1, 2):
        out = tmp_path / f"r{ranks}"
        out.mkdir()
        launch_ranks(script, ranks, out, 8 // ranks)
        got[ranks] = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)]
    one, (r0, r1) = got[1][0], got[2]
    assert r0["world_size"] == 2
    assert r0["kept"] == r1["kept"] == one["kept"]  # the same groups, in the same order, on every rank
    assert r0["rounds"] == r1["rounds"] == one["rounds"] and max(one["rounds"]) > 1
    for step in range(len(one["kept"])):
        assert len(r0["mine"][step]) == len(r1["mine"][step]) == len(one["kept"][step]) // 2  # one shape per rank
        assert sorted(r0["mine"][step] + r1["mine"][step]) == sorted(one["kept"][step])
        assert all(i >= 6 for i in one["kept"][step])  # hard rows only


def test_ray_trainers_with_async_prefetch(tmp_path: Any, tiny_model_dir: Any) -> None:
    """--distributed ray with async generation: the prefetched batch is the first round (one policy
    version old), refills roll out at once; every step trains a full batch of groups with spread.
    (Ranks agreeing on the groups is the torchrun test's; one trainer rank keeps this one cheap.)"""
    import sys

    ray = pytest.importorskip("ray")
    from rlcore.distributed import DistributedConfig, WorkerGroupConfig
    from rlcore.distributed.cluster import start_samplers
    from rlcore.distributed.runner import run_distributed
    from rlcore.distributed.runtime import ensure_ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this module
    cfg = DistributedConfig(trainer=WorkerGroupConfig(num_workers=1, num_cpus=0.5),
                            sampler=WorkerGroupConfig(num_workers=1, num_cpus=0.5), worker_timeout_s=120,
                            async_generation=True, max_staleness=1)
    started = not ray.is_initialized()
    ensure_ray(num_cpus=4)
    placed, pool = start_samplers(cfg, tiny_model_dir, seed=0)
    try:
        args = _args(str(tmp_path / "ray"), max_steps=2, use_cpu=True, per_device_train_batch_size=8)  # 4 groups
        result = run_distributed(tiny_model_dir, args, rows(), cfg, reward_funcs=[by_row], progress=False,
                                 samplers=(placed, pool))
    finally:
        placed.remove()
        if started:
            ray.shutdown()
    logs = [h for h in result.log_history if "loss" in h]
    assert result.global_step == 2 and len(logs) == 2
    assert all(h["dynamic_sampling/kept_groups"] == 4 and h["advantage_zero_std_frac"] == 0.0 for h in logs)
    assert any(h["dynamic_sampling/rounds"] > 1 for h in logs)
    assert all(h["dynamic_sampling/filtered_groups"] == h["dynamic_sampling/generated_groups"] - 4 -
               h["dynamic_sampling/surplus_groups"] for h in logs)
    assert logs[1]["async/max_lag"] == 1  # step 2's first round came from the prefetch, one version old


def test_smollm2_trains_only_groups_with_spread(tmp_path: Any, smollm2_dir: str) -> None:
    """The real SmolLM2-135M-Instruct: a step filled with hard rows' groups only, moving the weights
    (a real gradient from groups with spread)."""
    t = rlcore.GRPOTrainer(smollm2_dir, reward_funcs=[by_row], train_dataset=rows(easy=6, hard=6),
                           args=_args(str(tmp_path / "smol"), max_steps=1, max_completion_length=3,
                                      per_device_train_batch_size=4, activation_checkpointing=False))  # 2 groups
    trained: list[list[str]] = []
    generate = t._generate_and_score

    def recording() -> Any:
        out = generate()
        trained.append([tr.data["id"] for tr in t.whole_batch.trajectories])
        return out

    t._generate_and_score = recording
    t.train()
    logs = logged(t)
    assert len(trained) == len(logs) == 1
    assert all(len(ids) == 4 and all(i.startswith("h") for i in ids) for ids in trained)
    assert all(h["dynamic_sampling/kept_groups"] == 2 and h["grad_norm"] > 0 for h in logs)
