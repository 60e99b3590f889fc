"""examples/openenv/loop.py (seed 000 as a hand-written loop) runs two steps on the CPU with the
tiny model against a real guess_number server in its own process — with EnvTools (the seed's
path) and with bare-number replies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rlcore.testing import load_script

from rl_plugin_openenv.testing import ServerProcess

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "openenv" / "loop.py"


@pytest.fixture
def rlcore_plugins() -> str:
    return "rl-plugin-openenv"  # the example's env client and scheduler


def _example() -> Any:
    return load_script(EXAMPLE)


@pytest.fixture(scope="module")
def env_server():
    with ServerProcess(max_concurrent_envs=16) as server:
        yield server.url


@pytest.mark.timeout(300)
def test_loop_example_text_actions_learns_from_env_rewards(env_server: str, tiny_model_dir: str) -> None:
    example = _example()
    seen: list[list[Any]] = []
    history = example.train(
        tiny_model_dir, env_server, example.episodes(4, high=20, max_attempts=3), actions="text", steps=2,
        prompts_per_step=2, num_generations=4, max_turns=3, max_tokens=6, learning_rate=1e-3,
        on_step=lambda step, trajs, metrics: seen.append(trajs),
    )
    assert [h["step"] for h in history] == [1, 2]
    assert all(h["failed"] == 0 for h in history)
    trajs = [t for step in seen for t in step]
    assert len(trajs) == 16
    # the server's first observation is each episode's prompt, and episodes take several turns
    assert all("guess" in t.messages[0]["content"].lower() or "number" in t.messages[0]["content"].lower() for t in trajs)
    assert max(t.num_turns for t in trajs) > 1
    # shaped rewards from the env: a random policy's episodes differ, so the loss moved the policy
    assert all(t.reward is not None and t.reward == pytest.approx(sum(t.step_rewards)) for t in trajs)
    assert any(h["grad_norm"] > 0 for h in history)


@pytest.mark.timeout(300)
def test_loop_example_env_tools_path(env_server: str, tiny_model_dir: str) -> None:
    example = _example()
    seen: list[list[Any]] = []
    history = example.train(
        tiny_model_dir, env_server, example.episodes(2, high=20, max_attempts=3), actions="tools", steps=2,
        prompts_per_step=1, num_generations=4, max_turns=3, max_tokens=12, learning_rate=1e-3,
        on_step=lambda step, trajs, metrics: seen.append(trajs),
    )
    assert len(history) == 2 and all(h["failed"] == 0 for h in history)
    trajs = [t for step in seen for t in step]
    # each trajectory had its own session: the prompt is the server's first observation, the tool is in
    # the prompt, and the reward is the sum of what its EnvTool recorded
    assert all(t.messages[0]["content"].startswith("I am thinking of a number") for t in trajs)
    assert all(t.reward == pytest.approx(sum(t.step_rewards)) for t in trajs)
    assert len({t.uuid for t in trajs}) == 8


@pytest.mark.timeout(600)
def test_loop_example_with_ray_groups(env_server: str, tiny_model_dir: str) -> None:
    """--ray: the policy on DeviceGroup("model", num_workers=2), the sampler on
    DeviceGroup("sampler", num_workers=2), CPU actors; the episodes play several turns against the
    server and train two steps."""
    ray = pytest.importorskip("ray")
    example = _example()
    seen: list[list[Any]] = []
    try:
        history = example.train(
            tiny_model_dir, env_server, example.episodes(2, high=20, max_attempts=3), actions="text", steps=2,
            prompts_per_step=2, num_generations=2, max_turns=3, max_tokens=6, learning_rate=1e-3,
            on_step=lambda step, trajs, metrics: seen.append(trajs), ray=True, model_workers=2, sampler_workers=2,
        )
    finally:
        ray.shutdown()
    assert [h["step"] for h in history] == [1, 2] and all(h["failed"] == 0 for h in history)
    trajs = [t for step in seen for t in step]
    assert len(trajs) == 8 and max(t.num_turns for t in trajs) > 1
    assert all(t.reward == pytest.approx(sum(t.step_rewards)) for t in trajs)
