"""Reward plumbing: arguments by signature, per-sample error isolation, weighting, async concurrency."""

from __future__ import annotations

import asyncio
import time

from rlcore import RunHooks
from rlcore.rewards import FunctionReward, Reward, as_reward, compute_rewards
from rlcore.types import Completion, Trajectory, Turn


def _trajs(n: int = 3) -> list[Trajectory]:
    out = []
    for i in range(n):
        t = Trajectory(
            prompt_ids=[1],
            messages=[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"answer {i}"}],
            data={"answer": str(i), "difficulty": i * 10},
        )
        t.turns.append(Turn.sampled(Completion([5] * (i + 1), [-0.1] * (i + 1), text=f"answer {i}")))
        t.step_rewards = [float(i)]
        out.append(t)
    return out


async def test_rewards_get_only_the_arguments_they_name():
    seen = {}

    def exact(completions, answer):
        seen["args"] = (completions, answer)
        return [1.0 if c.endswith(a) else 0.0 for c, a in zip(completions, answer)]

    trajs = _trajs()
    cols = await compute_rewards(RunHooks(FunctionReward("exact", exact), observers=False), trajs)
    assert cols == {"exact": [1.0, 1.0, 1.0]}
    assert seen["args"] == (["answer 0", "answer 1", "answer 2"], ["0", "1", "2"])


async def test_trl_style_kwargs_reward_gets_every_column():
    def trl_style(prompts, completions, **kwargs):
        assert kwargs["difficulty"] == [0, 10, 20] and len(kwargs["completion_ids"]) == 3
        assert prompts[1] == [{"role": "user", "content": "q1"}]
        return [float(d) for d in kwargs["difficulty"]]

    cols = await compute_rewards(RunHooks(as_reward("trl", trl_style), observers=False), _trajs())
    assert cols["trl"] == [0.0, 10.0, 20.0]


async def test_a_sample_that_raises_gets_none_and_is_counted():
    def fragile(answer):
        return [1.0 / int(a) for a in answer]  # ZeroDivisionError on the first row only

    r = FunctionReward("fragile", fragile)
    trajs = _trajs()
    await compute_rewards(RunHooks(r, observers=False), trajs)
    assert [t.rewards["fragile"] for t in trajs] == [None, 1.0, 0.5]
    assert r.errors == 1
    assert trajs[0].reward is None and trajs[2].reward == 0.5


async def test_weighted_sum_skips_missing_values():
    def a(completions):
        return [1.0, None, 2.0]

    def b(completions):
        return [0.5, 0.5, float("nan")]

    trajs = _trajs()
    hooks = RunHooks(FunctionReward("a", a), FunctionReward("b", b), observers=False)
    await compute_rewards(hooks, trajs, weights={"a": 2.0, "b": -1.0})
    assert [t.reward for t in trajs] == [1.5, -0.5, 4.0]
    assert trajs[2].rewards == {"a": 2.0, "b": None}


async def test_async_rewards_run_concurrently_and_sync_ones_off_the_loop():
    async def slow_async(completions):
        await asyncio.sleep(0.3)
        return [1.0] * len(completions)

    def slow_sync(completions):
        time.sleep(0.3)
        return [2.0] * len(completions)

    hooks = RunHooks(FunctionReward("x", slow_async), FunctionReward("y", slow_async), FunctionReward("z", slow_sync), observers=False)
    t0 = time.perf_counter()
    cols = await compute_rewards(hooks, _trajs())
    assert time.perf_counter() - t0 < 0.75  # three 0.3 s rewards overlapped, not 0.9 s in series
    assert cols["z"] == [2.0, 2.0, 2.0]


async def test_reward_subclass_and_env_reward():
    class Longest(Reward):
        name = "longest"

        def score(self, completion_ids):
            m = max(len(c) for c in completion_ids)
            return [float(len(c) == m) for c in completion_ids]

    import rlcore

    env = as_reward("env_reward", rlcore.get("reward", "env_reward"))
    trajs = _trajs()
    cols = await compute_rewards(RunHooks(as_reward("longest", Longest), env, observers=False), trajs)
    assert cols == {"longest": [0.0, 0.0, 1.0], "env_reward": [0.0, 1.0, 2.0]}


async def test_a_wrong_number_of_values_stops_at_once_instead_of_passing_per_sample():
    """A reward returning one value for the batch (a mean, a forgotten loop) used to be retried one
    sample at a time, where one value per call looks right: every sample silently got it."""
    import pytest

    from rlcore import RewardFunctionError
    from rlcore.rewards import RewardCountError

    calls = []

    def one_score(completions):
        calls.append(len(completions))
        return [1.0]

    trajs = _trajs()
    with pytest.raises(RewardFunctionError, match=r"reward 'one_score' returned 1 value for 3 trajectories; a reward returns"):
        await compute_rewards(RunHooks(FunctionReward("one_score", one_score), observers=False), trajs)
    assert calls == [3] and all("one_score" not in t.rewards for t in trajs)

    def not_a_list(completions):
        return {"score": 1.0}

    with pytest.raises(RewardCountError, match="returned a dict for 3 trajectories"):
        await compute_rewards(RunHooks(FunctionReward("not_a_list", not_a_list), observers=False), _trajs())


def test_a_reward_needing_a_column_the_dataset_lacks_is_one_line_before_training(tmp_path):
    """A reward that requires ``solution`` on a dataset with ``answer`` used to get None for every
    row and the run trained on nothing while looking fine."""
    import pytest

    from rlcore import DatasetError, GRPOConfig, GRPOTrainer
    from rlcore.rewards import check_reward_columns
    from rlcore.testing import tiny_model_path

    def needs_solution(completions, solution, **kwargs):
        return [float(c == s) for c, s in zip(completions, solution)]

    def optional_solution(completions, solution=None):
        return [0.0] * len(completions)

    rows = [{"prompt": "1+1", "answer": "2"}, {"prompt": "2+2", "answer": "4", "solution": "4"}]
    check_reward_columns([FunctionReward("needs_solution", needs_solution)], rows)  # some rows have it: fine
    check_reward_columns([FunctionReward("optional_solution", optional_solution), as_reward("exact", lambda completions, prompts, trajectories: [])],
                         rows[:1])
    with pytest.raises(DatasetError, match=r"reward 'needs_solution' needs the column 'solution', which train_dataset "
                                           r"does not have \(columns: prompt, answer\).*solution=None"):
        check_reward_columns([FunctionReward("needs_solution", needs_solution)], rows[:1], "train_dataset")

    args = GRPOConfig(output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=2, max_steps=1,
                      max_completion_length=4, report_to="none", save_strategy="no", plots=False, disable_tqdm=True)
    with pytest.raises(DatasetError, match="needs the column 'solution'"):
        GRPOTrainer(tiny_model_path(), reward_funcs=[needs_solution], args=args, train_dataset=rows[:1] * 4)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
