"""The README's gym quickstart, for a few steps: ``rlcore train --scheduler gym_scheduler --env
frozen_lake --reward gym_reward --max_turns 6`` with no model and no dataset plays the embedded
default on a real gymnasium FrozenLake-v1, and its episodes are multi-turn: they end at the goal, in
a hole, after invalid replies (the env's ``done``) or at ``max_turns`` — never because a reply ran
into the token cap. (The learning curve of the full run is ``bench/quickstarts.py``'s.)"""

from __future__ import annotations

import json

from rlcore.commands.cli import main
from rlcore.testing.runs import check_multi_turn_run
from rlcore.commands.train import build_plan


def test_quickstart_trains_multi_turn_episodes(tmp_path, capsys):
    out = tmp_path / "run"
    main(["train", "--scheduler", "gym_scheduler", "--env", "frozen_lake", "--reward", "gym_reward", "--max_turns", "6",
          "--max_steps", "2", "--plots", "false", "--output_dir", str(out)])
    check_multi_turn_run(out, capsys.readouterr().out, steps=2, episodes_per_step=16)


def test_embedded_default_without_env_is_frozen_lake(tiny_model_dir):
    plan = build_plan(["--scheduler", "gym_scheduler", "--reward", "gym_reward"])
    sched = plan.component_options["scheduler"]
    assert sched["env"] == "frozen_lake" and sched["stop"] == [" ", "\n"]
    assert plan.args.max_turns == 6 and plan.args.max_completion_length == 4 and plan.args.learning_rate == 3e-3
    other = build_plan(["--scheduler", "gym_scheduler", "--env", "CliffWalking-v1", "--model", tiny_model_dir])
    assert other.component_options["scheduler"]["env"] == "CliffWalking-v1"  # the user's env wins
    assert other.args.learning_rate == 1e-6 and other.args.reward_funcs == ["gym_reward"]


def test_rollout_dumps_multi_turn_episodes(tmp_path):
    out = tmp_path / "rollouts.jsonl"
    main(["rollout", "--scheduler", "gym_scheduler", "--num-generations", "2", "--limit", "2",
          "--reward", "gym_reward", "--no-progress", "-o", str(out)])
    trajs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(trajs) == 4
    for t in trajs:
        assert t["num_turns"] >= 2 and len(t["step_rewards"]) == t["num_turns"]
        assert [m["role"] for m in t["messages"]].count("assistant") == t["num_turns"]
        assert "frozen lake" in t["messages"][0]["content"]
