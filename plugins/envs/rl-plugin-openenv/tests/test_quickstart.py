"""The README's OpenEnv quickstart, for a few steps: ``rlcore train --scheduler openenv_scheduler
--env-url URL --reward openenv_reward`` with no model and no dataset plays the embedded default
(guess_number, dense reward, bare-number replies) against a real server on 127.0.0.1, and its
episodes are multi-turn: they end by the env's ``done`` or ``max_turns``, never by length.
(The learning curve of the full run is ``bench/quickstarts.py``'s job, not a test's.)"""

from __future__ import annotations

import json

from rlcore.commands.cli import main
from rlcore.testing.runs import check_multi_turn_run
from rlcore.data.tasks import default_task_for
from rlcore.commands.train import build_plan

import rlcore
from rl_plugin_openenv.default_task import GUESSES


def test_quickstart_trains_multi_turn_episodes(server, tmp_path, capsys):
    out = tmp_path / "run"
    main(["train", "--scheduler", "openenv_scheduler", "--env-url", server, "--reward", "openenv_reward",
          "--max_steps", "2", "--per_device_train_batch_size", "16", "--plots", "false", "--output_dir", str(out)])
    check_multi_turn_run(out, capsys.readouterr().out, steps=2, episodes_per_step=16)


def test_embedded_default_is_the_task_and_the_tiny_recipe_only_without_a_model(server, tiny_model_dir):
    plan = build_plan(["--scheduler", "openenv_scheduler", "--env-url", server, "--reward", "openenv_reward"])
    assert plan.task == "guess_number" and plan.args.max_turns == GUESSES
    assert plan.args.learning_rate == 3e-3 and plan.args.max_completion_length == 6
    sched = plan.component_options["scheduler"]
    assert sched["stop"] == [" ", "\n"] and sched["stop_on_truncation"] is False and sched["env_url"] == server
    assert all(r["env_config"]["reset_kwargs"]["shaped"] for r in plan.rows)

    real = build_plan(["--scheduler", "openenv_scheduler", "--env-url", server, "--model", tiny_model_dir,
                       "--stop", "\n\n"])
    assert real.args.learning_rate == 1e-6  # GRPOConfig's default for real models, not the tiny recipe
    assert real.args.max_turns == GUESSES and real.args.reward_funcs == ["openenv_reward"]
    assert real.component_options["scheduler"]["stop"] == ["\n\n"]  # the user's flag beats the task's


def test_a_dataset_replaces_the_embedded_default(server, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "play", "env_config": {"seed": 1}}) + "\n")
    plan = build_plan(["--scheduler", "openenv_scheduler", "--env-url", server, "--dataset", str(rows),
                       "--reward", "openenv_reward"])
    assert plan.task == str(rows) and plan.args.max_turns is None and plan.args.learning_rate == 1e-6
    assert "stop" not in plan.component_options["scheduler"]


def test_default_task_is_declared_by_the_scheduler():
    task = default_task_for(rlcore.get("scheduler", "openenv_scheduler"))
    assert task.name == "guess_number" and len(task.rows) >= 64
    assert {r["env_config"]["seed"] for r in task.rows} == set(range(len(task.rows)))


def test_rollout_dumps_multi_turn_episodes(server, tmp_path):
    out = tmp_path / "rollouts.jsonl"
    main(["rollout", "--scheduler", "openenv_scheduler", "--env-url", server, "--num-generations", "2",
          "--limit", "3", "--reward", "openenv_reward", "--no-progress", "-o", str(out)])
    trajs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(trajs) == 6
    assert sum(t["num_turns"] >= 2 for t in trajs) >= 4  # multi-turn episodes, not single replies
    for t in trajs:
        # an episode is one turn only when its first guess found the number (reward 1, the env ended it)
        won_at_once = t["num_turns"] == 1 and t["infos"].get("env_done") and t["step_rewards"][-1] >= 1.0
        assert t["status"] in ("ok", "truncated") and (t["num_turns"] >= 2 or won_at_once), t["step_rewards"]
        assert len(t["step_rewards"]) == t["num_turns"]
        roles = [m["role"] for m in t["messages"]]
        assert roles.count("assistant") == t["num_turns"]
        assert "whole number" in t["messages"][0]["content"]  # the bare-number reply format
        sampled = [turn for turn in t["turns"] if turn["loss_mask"] and turn["loss_mask"][0] == 1]
        assert all(len(turn["token_ids"]) <= 6 for turn in sampled)
