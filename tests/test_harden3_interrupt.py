"""Issue 35 item 6: Ctrl-C during ``rlcore train`` while a plain (sync) reward is running. The first
interrupt still stops the run cleanly (summary, resume hint, exit code 130) once the reward returns,
and now says so; a second one ends the process at once, with one line and exit code 130. Real
processes, real SIGINTs, a reward plugin installed in a site directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlcore.testing.packages import write_site_plugin

PLUGIN = """
import os
import time

import rlcore


def sleepy(completions):
    with open(os.environ["SLEEPY_MARK"], "a") as f:  # one mark per call: the test waits for the second
        f.write("x")
    if os.path.getsize(os.environ["SLEEPY_MARK"]) >= 2:
        time.sleep(float(os.environ["SLEEPY_SECONDS"]))
    return [float(i % 2) for i in range(len(completions))]


@rlcore.hookimpl
def register_rewards(register):
    register("sleepy", sleepy)
"""


def start(tmp_path: Path, seconds: float) -> tuple[subprocess.Popen[str], Path, Path]:
    """``rlcore train`` whose reward sleeps ``seconds`` on its second call; returns once it sleeps."""
    site = write_site_plugin(tmp_path / "site", "rl-plugin-sleepy", "sleepy_plugin", PLUGIN)
    mark, out = tmp_path / "mark", tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "RLCORE_PLUGINS": "rl-plugin-sleepy", "SLEEPY_MARK": str(mark), "SLEEPY_SECONDS": str(seconds)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlcore.commands.cli", "train", "--reward", "sleepy", "--max_steps", "3", "--num_generations", "4",
         "--save_strategy", "steps", "--save_steps", "1", "--output_dir", str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (mark.exists() and mark.stat().st_size >= 2):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the reward was never called a second time"
        time.sleep(0.1)
    time.sleep(0.5)  # inside time.sleep now
    return proc, out, mark


def kept(out: Path) -> None:
    """What the first step wrote is whole: its metrics line (strict JSON) and its checkpoint."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert (out / "checkpoint-1" / "model.safetensors").is_file()


def test_a_second_ctrl_c_ends_the_run_at_once(tmp_path: Path) -> None:
    """Before: the summary printed, then the process sat until the 60 s reward returned; the second
    Ctrl-C was ignored."""
    proc, out, _ = start(tmp_path, 60)
    try:
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        second = time.monotonic()
        stdout, stderr = proc.communicate(timeout=30)
        ended = time.monotonic() - second
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert ended < 5, f"ended {ended:.1f} s after the second Ctrl-C"
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert lines[-1] == (
        "interrupted again: exiting now without waiting (exit code 130); metrics.jsonl and the checkpoints written "
        f"so far are kept; resume: add --resume_from_checkpoint true --output-dir {out} to the same command "
        "(continues from checkpoint-1)")
    assert "Traceback" not in stderr and "Traceback" not in stdout
    kept(out)


def test_the_first_ctrl_c_still_stops_cleanly_and_says_how_to_stop_at_once(tmp_path: Path) -> None:
    """The first interrupt keeps today's behaviour — the running reward returns, then the
    'interrupted' summary with the resume hint and exit code 130 — and now says what it waits for."""
    proc, out, _ = start(tmp_path, 4)
    try:
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert ("interrupted: stopping once the running step's reward or environment calls return — press Ctrl-C "
            "again to exit at once") in stderr.splitlines()
    assert "interrupted" in stdout and "continues from checkpoint-1" in " ".join(stdout.split())
    assert "Traceback" not in stderr and "Traceback" not in stdout
    kept(out)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".incomplete")]
