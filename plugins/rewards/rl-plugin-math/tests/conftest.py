"""Fixtures for rl-plugin-math's tests: load only this plugin, real GSM8K rows, real trajectories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from rlcore.types import Trajectory, Turn


@pytest.fixture(scope="session")
def gsm8k_rows(shared_data: Path) -> list[dict[str, Any]]:
    """Every row of GSM8K's test split, read from the shared data folder (never copied here;
    rlcore's ``shared_data`` fixture skips, or fails in CI, when the folder is absent)."""
    path = shared_data / "gsm8k" / "test.jsonl"
    assert path.is_file(), f"the shared data folder {shared_data} has no gsm8k/test.jsonl"
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture
def make_traj() -> Callable[..., Trajectory]:
    """A finished one-turn trajectory whose assistant message is ``text`` (and ``n_tokens`` tokens)."""

    def make(text: str, row: dict[str, Any] | None = None, n_tokens: int = 4) -> Trajectory:
        row = row or {}
        ids = list(range(n_tokens))
        return Trajectory(
            prompt_ids=[1, 2, 3],
            messages=[{"role": "user", "content": row.get("question", "q")}, {"role": "assistant", "content": text}],
            data=dict(row),
            turns=[Turn(token_ids=ids, loss_mask=[1] * n_tokens, logprobs=[-0.5] * n_tokens, text=text)],
            status="ok",
            num_turns=1,
        )

    return make
