"""`rlcore rollout` streams its output (issue 35 item 3), and its rewards still score a prompt's
group together, as training does: a reward that compares the completions of one prompt (a rank,
a group-relative score) gets the whole group, never one trajectory at a time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlcore.commands.cli import main
from rlcore.testing.packages import load_in_process


def group_rank(completions: list[Any], **kwargs: Any) -> list[float]:
    """Each completion's rank by length within the call (0 = shortest): 0, 1, 2, … for a group."""
    order = sorted(range(len(completions)), key=lambda i: (len(str(completions[i])), i))
    ranks = [0.0] * len(completions)
    for r, i in enumerate(order):
        ranks[i] = float(r)
    return ranks


@pytest.fixture
def group_rank_reward(monkeypatch: pytest.MonkeyPatch) -> str:
    load_in_process(monkeypatch, "group_rank_reward_plugin", register_rewards=lambda register: register("group_rank_t", group_rank))
    return "group_rank_t"


def test_rollout_rewards_see_the_whole_group(group_rank_reward: str, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    main(["rollout", "--limit", "3", "--num-generations", "4", "--max-completion-length", "6", "--no-progress",
          "--seed", "1", "--reward", group_rank_reward, "--output", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r["group_id"], []).append(r["reward"])
    assert len(groups) == 3
    assert all(sorted(v) == [0.0, 1.0, 2.0, 3.0] for v in groups.values()), groups
