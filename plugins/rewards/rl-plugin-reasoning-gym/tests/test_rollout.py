"""``rlcore rollout`` with a reasoning-gym dataset, on the CPU with the tiny model: rollouts scored by
the task's own scorer (the repository's example config has its own test, tests/test_example_reasoning_gym.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path


def test_rollout_cli_with_a_reasoning_gym_dataset(tiny_model_dir: str, tmp_path: Path) -> None:
    from rlcore.commands.rollout import run_rollout_command

    out = tmp_path / "rollouts.jsonl"
    opts = dict(
        scheduler="default", model=tiny_model_dir, dataset="reasoning_gym:gcd,leg_counting?seed=2&system_prompt=none",
        dataset_options="size=3", split="train", prompt_column=None, system_prompt=None, limit=0, num_generations=2,
        max_turns=None, max_tokens=6, temperature=1.0, top_p=1.0, seed=0, sampler="hf",
        rewards=("reasoning_gym", "reasoning_gym_format=0.5"), concurrency=8, timeout=None, output=str(out), progress=False,
    )
    summary = asyncio.run(run_rollout_command(extra_args=[], **opts))
    assert summary.startswith(f"wrote 6 trajectories to {out}")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 6
    for t in lines:
        assert t["data"]["reasoning_gym"]["task"] in ("gcd", "leg_counting")
        assert set(t["rewards"]) == {"reasoning_gym", "reasoning_gym_format"}
        assert 0.0 <= t["rewards"]["reasoning_gym"] <= 1.0
