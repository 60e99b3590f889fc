"""Checkpoint, kill, resume on the real model (SmolLM2-135M-Instruct, CPU): a GRPO run on GSM8K rows
that saves after every step is killed with SIGKILL once checkpoint-1 is on disk, resumed from it in a
new process, and then has logged exactly what an uninterrupted run logged (rewards, loss, gradient
norm, entropy, learning rate, lengths …) and ends with the same weights: the resumed step needs the
model, the optimizer's moments, the lr schedule, the sampler's RNG and the data position back. Each
run is ``tests/real_model_run.py`` in its own process, the way a user's run is started and killed.
Two steps, the smallest run where a step follows a resume (a step of this model costs seconds on a
CPU, and each process pays ~10 s of imports and loading)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file

SCRIPT = Path(__file__).with_name("real_model_run.py")
STEPS = 2
#: logged values that measure the machine, not the run
TIMINGS = ("step_time", "rollout_time", "train_time", "tokens_per_second", "invariant_check_time")


@pytest.fixture
def rlcore_plugins() -> str:
    return "rl-plugin-math"


@pytest.fixture
def run_script(smollm2_dir: str) -> Iterator[Callable[[Path, Path, str], subprocess.Popen[str]]]:
    """Start ``real_model_run.py`` (RLCORE_PLUGINS and the offline variables come from this test's
    environment); whatever is still running when the test ends is killed, and the runs' output
    (1.6 GB per checkpoint of this model) is removed."""
    started: list[tuple[subprocess.Popen[str], Path]] = []

    def start(rows: Path, out: Path, mode: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, str(SCRIPT), smollm2_dir, str(rows), str(out), mode],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started.append((proc, out))
        return proc

    yield start
    for proc, out in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        shutil.rmtree(out, ignore_errors=True)


def finish(proc: subprocess.Popen[str], timeout: float = 480) -> None:
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, output[-3000:]


def steps(out: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without the timings (a torn last line is what a kill can leave: skipped)."""
    rows = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows.append({k: v for k, v in row.items() if k not in TIMINGS})
    return rows


@pytest.mark.timeout(1200)
def test_a_killed_run_resumed_from_its_checkpoint_logs_what_an_uninterrupted_run_logs(
    shared_data: Path, tmp_path: Path, run_script: Callable[[Path, Path, str], subprocess.Popen[str]]
) -> None:
    with (shared_data / "gsm8k" / "train.jsonl").open(encoding="utf-8") as f:
        gsm8k = sorted((json.loads(line) for line in f if line.strip()), key=lambda r: len(r["question"]))
    rows = tmp_path / "rows.jsonl"  # real rows, the shortest questions (2 per step)
    rows.write_text("".join(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n" for r in gsm8k[:4]))
    whole, parts = tmp_path / "whole", tmp_path / "parts"

    finish(run_script(rows, whole, "whole"))
    reference = steps(whole)
    assert [r["step"] for r in reference] == list(range(1, STEPS + 1))
    assert all(r["grad_norm"] > 0 for r in reference)  # every step trained: the optimizer state matters

    proc = run_script(rows, parts, "checkpointed")
    deadline = time.monotonic() + 480
    while not (parts / "checkpoint-1").is_dir():  # published by a rename: complete once it is there
        assert proc.poll() is None, (proc.communicate()[0] or "")[-3000:]
        assert time.monotonic() < deadline, "no checkpoint-1 after 8 minutes"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (parts / "checkpoint-2").exists()
    assert [r["step"] for r in steps(parts)] == [1]  # killed during step 2
    ck = parts / "checkpoint-1"
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "rlcore_state.json"):
        assert (ck / name).is_file(), name

    finish(run_script(rows, parts, "resume"))
    resumed = steps(parts)
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
    # the weights after the last step: what the restored optimizer moments and lr schedule did
    # (no logged value of the last step depends on them — its loss and grad norm come before its update)
    final, last = load_file(str(whole / "final" / "model.safetensors")), load_file(str(parts / "checkpoint-2" / "model.safetensors"))
    assert final.keys() == last.keys()
    assert all(torch.equal(final[k], last[k]) for k in final), \
        max(float((final[k] - last[k]).abs().max()) for k in final)
    for want, got in zip(reference, resumed):
        assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
        for key, value in want.items():
            if isinstance(value, float) and isinstance(got[key], float) and math.isfinite(value):
                assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-7), (want["step"], key, got[key], value)
            else:
                assert got[key] == value, (want["step"], key, got[key], value)
