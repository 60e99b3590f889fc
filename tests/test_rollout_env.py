"""EnvScheduler: one env per trajectory, blocking env calls off the loop, failures stay local."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rlcore.rollout import EnvScheduler, encode_prompt, render, run_rollouts
from rlcore.rewards import compute_rewards, env_reward, FunctionReward
from rlcore.plugins import RunHooks
from rlcore.testing import ScriptedSampler
from rlcore.types import Prompt, SamplingParams


@pytest.fixture(scope="module")
def tok(tiny_model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class GuessEnv:
    """A blocking (sync) text game: guess the target; each step sleeps like a remote call."""

    closed: list[int] = []

    def __init__(self, target: int, sleep: float = 0.0, fail_on_step: bool = False) -> None:
        self.target, self.sleep, self.fail_on_step = target, sleep, fail_on_step
        self.thread_ids: list[int] = []

    def reset(self, request: Any):
        return f"Guess a number from 1 to 9.", {"target": self.target}, "You play a guessing game."

    def step(self, action: str):
        self.thread_ids.append(threading.get_ident())
        time.sleep(self.sleep)
        if self.fail_on_step:
            raise ConnectionError("env server down")
        guess = int(action) if action.isdigit() else -1
        if guess == self.target:
            return "correct", 1.0, True, {"guess": guess}
        return ("higher" if guess < self.target else "lower"), -0.1, False, {"guess": guess}

    def close(self) -> None:
        GuessEnv.closed.append(self.target)


class GuessScheduler(EnvScheduler):
    def __init__(self, *a: Any, sleep: float = 0.0, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.sleep = sleep
        self.envs: list[GuessEnv] = []

    def make_env(self, trajectory):
        env = GuessEnv(int(trajectory.data_dict["target"]), self.sleep, trajectory.data_dict.get("broken", False))
        self.envs.append(env)
        return env


def rows(tok: Any, targets: list[int], broken: int | None = None) -> list[Prompt]:
    msgs = [{"role": "user", "content": "placeholder"}]
    return [Prompt(msgs, encode_prompt(tok, msgs), data={"target": t, "broken": t == broken}) for t in targets]


async def test_env_rollout_messages_rewards_and_tokens(tok: Any) -> None:
    GuessEnv.closed.clear()
    sampler = ScriptedSampler(["3", "5", "7"], tok)
    sched = GuessScheduler(sampler, max_turns=4)
    res = await run_rollouts(sched, rows(tok, [5]), sampling_params=SamplingParams(max_tokens=8), progress=False)
    t = res.trajectories[0]
    assert t.status == "ok" and t.num_turns == 2  # 3 → higher, 5 → correct (done)
    assert t.messages[:2] == [{"role": "system", "content": "You play a guessing game."},
                              {"role": "user", "content": "Guess a number from 1 to 9."}]
    assert t.messages[3] == {"role": "user", "content": "higher"}
    assert t.prompt_ids == encode_prompt(tok, t.messages[:2])
    assert tok.decode(t.input_ids, skip_special_tokens=False) + "\n" == render(tok, t.messages)
    assert t.step_rewards == [-0.1, 1.0] and t.infos["env_info"] == {"guess": 5}
    assert GuessEnv.closed == [5]
    await compute_rewards(RunHooks(FunctionReward("env_reward", env_reward), observers=False), [t])
    assert t.reward == pytest.approx(0.9)
    # blocking env.step ran in worker threads, never on the loop's thread
    assert threading.get_ident() not in sched.envs[0].thread_ids


async def test_env_failure_and_timeout_fail_only_their_trajectory(tok: Any) -> None:
    GuessEnv.closed.clear()
    sampler = ScriptedSampler(["5"], tok)
    res = await run_rollouts(GuessScheduler(sampler), rows(tok, [5, 6, 5], broken=6), progress=False)
    statuses = sorted(t.status for t in res.trajectories)
    assert statuses == ["failed", "ok", "ok"]
    bad = [t for t in res.trajectories if t.status == "failed"][0]
    assert bad.reason == "env step failed: ConnectionError: env server down"
    assert sorted(GuessEnv.closed) == [5, 5, 6]  # closed on every path

    slow = GuessScheduler(ScriptedSampler(["1"], tok), sleep=1.0, env_timeout=0.1)
    res = await run_rollouts(slow, rows(tok, [5]), progress=False)
    assert res.trajectories[0].reason == "env step timed out after 0.1s"


async def test_slow_env_steps_overlap(tok: Any) -> None:
    sampler = ScriptedSampler(["1"], tok)
    sched = GuessScheduler(sampler, sleep=0.2, max_turns=2)
    t0 = time.perf_counter()
    res = await run_rollouts(sched, rows(tok, [9] * 8), progress=False)
    wall = time.perf_counter() - t0
    assert res.stats["ok"] == 8 and res.stats["turns"] == 16
    assert wall < 8 * 2 * 0.2 / 2  # 16 sleeps of 0.2 s ran concurrently, far below 3.2 s serial


async def test_stop_strings_end_a_turn_and_a_cut_reply_can_go_on(tok: Any) -> None:
    """``stop`` joins the sampling params' stop list (the turn ends at the first space, its tokens
    kept); with ``stop_on_truncation=False`` a reply cut by ``max_tokens`` still reaches the env."""
    GuessEnv.closed.clear()
    stopped = ScriptedSampler(["3 and more"], tok, append_eos=False)
    sched = GuessScheduler(stopped, max_turns=2, stop=[" "])
    res = await run_rollouts(sched, rows(tok, [5]), sampling_params=SamplingParams(max_tokens=8, stop=["\n\n"]),
                             progress=False)
    t = res.trajectories[0]
    assert all(p.stop == ["\n\n", " "] for _, p in stopped.calls)
    assert [turn.finish_reason for turn in t.turns if turn.loss_mask[0] == 1] == ["stop", "stop"]
    assert t.messages[2]["content"] == "3 and"  # cut after the token that holds the space, tokens kept
    assert t.infos["env_done"] is False and t.infos["ended_by"] == "max_turns" and t.status == "ok"

    cut = ScriptedSampler(["1234567890123"], tok, append_eos=False)
    res = await run_rollouts(GuessScheduler(cut, max_turns=3, stop_on_truncation=False), rows(tok, [5]),
                             sampling_params=SamplingParams(max_tokens=2), progress=False)
    t = res.trajectories[0]
    assert t.num_turns == 3 and t.infos["ended_by"] == "max_turns" and t.status == "truncated"
    res = await run_rollouts(GuessScheduler(cut, max_turns=3), rows(tok, [5]),
                             sampling_params=SamplingParams(max_tokens=2), progress=False)
    t = res.trajectories[0]
    assert t.num_turns == 1 and t.infos["ended_by"] == "length"
