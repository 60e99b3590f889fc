"""Embedded defaults: a scheduler's own ``default_task()`` (else digits), the split between the task's
config and the tiny-model recipe, and the episode metrics env runs report next to the reward."""

from __future__ import annotations

import pytest

from rlcore.errors import PluginError
from rlcore.data.tasks import DEFAULT_TRAIN_CONFIG, DefaultTask, default_task_for
from rlcore.commands.train import episode_rows
from rlcore.training.metrics import episode_metrics
from rlcore.types import Trajectory, Turn


class Plain:
    pass


class WithTask:
    @staticmethod
    def default_task() -> DefaultTask:
        return DefaultTask("game", [{"prompt": "play"}], task_config={"max_turns": 3},
                           recipe={"learning_rate": 0.1}, scheduler_options={"stop": ["\n"]})


class Broken:
    @staticmethod
    def default_task() -> dict:
        return {"rows": []}


def test_a_scheduler_without_a_task_gets_digits():
    task = default_task_for(Plain)
    assert task.name == "digits" and task.config(tiny_model=True) == DEFAULT_TRAIN_CONFIG
    assert task.config(tiny_model=False) == DEFAULT_TRAIN_CONFIG  # unchanged: digits applies as a whole


def test_the_recipe_applies_only_to_the_tiny_model():
    task = default_task_for(WithTask)
    assert task.name == "game" and task.scheduler_options == {"stop": ["\n"]}
    assert task.config(tiny_model=True) == {"max_turns": 3, "learning_rate": 0.1}
    assert task.config(tiny_model=False) == {"max_turns": 3}


def test_a_wrong_default_task_is_one_line():
    with pytest.raises(PluginError, match="Broken.default_task\\(\\) returned dict"):
        default_task_for(Broken)


def _traj(turns: int, finish: str, *, done: bool = False, ended_by: str | None = None, status: str = "ok") -> Trajectory:
    t = Trajectory(prompt_ids=[1], status=status, num_turns=turns)
    for i in range(turns):
        t.turns.append(Turn([5, 6], [1, 1], [-1.0, -1.0], finish_reason=finish if i == turns - 1 else "stop"))
        t.turns.append(Turn.observation([7]))
    t.infos.update(env_steps=turns, env_done=done)
    if ended_by:
        t.infos["ended_by"] = ended_by
    return t


def test_episode_metrics_say_what_ended_each_episode():
    batch = [_traj(3, "stop", done=True), _traj(6, "length", ended_by="max_turns", status="truncated"),
             _traj(2, "length", ended_by="length", status="truncated"), _traj(1, "stop", status="failed")]
    m = episode_metrics(batch)
    assert m["env_steps"] == 12
    assert (m["episodes_ended/env_done"], m["episodes_ended/max_turns"], m["episodes_ended/length"],
            m["episodes_ended/failed"]) == (0.25, 0.25, 0.25, 0.25)
    assert m["turns_ended_by_stop"] == pytest.approx(10 / 12)
    assert episode_metrics([Trajectory(prompt_ids=[1])]) == {}  # single-turn runs: nothing to say


def test_summary_rows_for_env_runs():
    rows = [{"num_turns": 2.0, "env_steps": 32.0, "episodes_ended/env_done": 1.0, "turns_ended_by_stop": 0.5}] * 5 + \
           [{"num_turns": 4.0, "env_steps": 64.0, "episodes_ended/env_done": 0.5, "turns_ended_by_stop": 1.0}] * 5
    out = dict(episode_rows(rows))
    assert out["turns per episode (first 10% → last 10%)"] == "2.00 → 4.00"
    assert out["env steps"] == "480 in 10 steps"
    assert out["episodes ended by"] == "env done 75%" and out["turns ended by stop"] == "75%"
    assert episode_rows([{"num_turns": 1.0}]) == []
