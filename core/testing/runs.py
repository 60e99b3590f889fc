"""Checks on a finished run's output that several test suites make (the env quickstarts of
rl-plugin-gym and rl-plugin-openenv promise the same things about their runs), and the launch of a
run script as one process or as torchrun ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_steps(output_dir: str | Path) -> list[dict[str, Any]]:
    """The per-step metrics a run wrote (``metrics.jsonl`` in its output directory)."""
    return [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def check_multi_turn_run(output_dir: str | Path, summary: str, *, steps: int, episodes_per_step: int) -> list[dict[str, Any]]:
    """Assert that a multi-turn env run trained ``steps`` steps in which no trajectory failed, every
    episode took at least two turns and ended by the env or the turn cap (never by the length cap),
    each of ``episodes_per_step`` episodes stepped the env, most turns ended at a stop string, and
    the printed ``summary`` reports turns, env steps and how episodes ended. Returns the steps."""
    rows = run_steps(output_dir)
    assert len(rows) == steps, f"{len(rows)} steps in metrics.jsonl, expected {steps}"
    for s in rows:
        assert s["failed_trajectories"] == 0, s
        assert s["num_turns"] >= 2, s
        assert s["episodes_ended/length"] == 0.0, s
        assert abs(s["episodes_ended/env_done"] + s["episodes_ended/max_turns"] - 1.0) < 1e-6, s
        assert s["env_steps"] >= 2 * episodes_per_step, s
        assert s["turns_ended_by_stop"] > 0.5, s  # a short reply ends at a stop string, not at the token cap
    for part in ("turns per episode", "env steps", "episodes ended by"):
        assert part in summary, f"the run's summary does not report {part!r}"
    return rows


def launch_ranks(script: str | Path, ranks: int, *args: str, timeout: float = 300) -> None:
    """Run ``script args…`` as one process (``ranks`` 1) or under ``torchrun --standalone
    --nproc_per_node ranks`` on the CPU (one thread a rank); fails with the tail of its stderr unless
    it exits 0. The script writes what the test compares."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)] \
        if ranks > 1 else [sys.executable]
    proc = subprocess.run([*launch, str(script), *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]


def stop_at_step(step: int) -> Any:
    """A ``TrainerCallback`` that ends training once ``global_step`` reaches ``step`` (as if the run
    was stopped there: what a resume then picks up)."""
    from transformers import TrainerCallback

    class StopAtStep(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if state.global_step == step:
                control.should_training_stop = True
            return control

    return StopAtStep()
