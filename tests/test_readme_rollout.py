"""The README's quick look at rollouts shows multi-turn episodes (issue 34, point 8): its
`rlcore rollout --scheduler multi_turn --max-turns 3` wrote "0 ok, 32 truncated", 31 of the 32
trajectories single-turn. The command is run here as the README gives it."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from rlcore.commands.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture
def rlcore_plugins() -> str:
    """The README assumes the repository's plugin packages are installed (requirements-dev.txt)."""
    return "rl-plugin-gym"


def _readme_command() -> list[str]:
    section = README.read_text(encoding="utf-8").split("## Rollouts only", 1)[1].split("\n## ", 1)[0]
    (line,) = re.findall(r"^    (rlcore rollout .*)$", section, flags=re.M)
    return shlex.split(line)


def test_the_readme_rollout_shows_multi_turn_episodes(tmp_path: Any, capsys: Any) -> None:
    argv = _readme_command()
    if "gym_scheduler" in argv:
        pytest.importorskip("rl_plugin_gym")
    out = tmp_path / "rollouts.jsonl"
    argv = [str(out) if a == "rollouts.jsonl" else a for a in argv[1:]] + ["--no-progress"]
    main(argv)
    episodes = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    multi = [e for e in episodes if e["num_turns"] > 1]
    assert len(episodes) >= 8 and len(multi) >= 0.9 * len(episodes), [e["num_turns"] for e in episodes]
    assert sum(e["status"] == "ok" for e in episodes) >= len(episodes) // 2
    said = capsys.readouterr().err
    assert "per trajectory)" in said and "Loading weights" not in said
