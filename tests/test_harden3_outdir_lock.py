"""One live run per output directory (issue 35, item 2): a run holds an ``flock`` on
``OUTPUT_DIR/.rlcore.lock`` while it trains. A second run into that directory — a resume, a fresh
run with ``--overwrite_output_dir``, a ``GRPOTrainer`` from Python — is one line naming the live
run, before the model loads, and deletes nothing. A SIGKILLed run leaves no stuck lock: the OS
drops it with the process. Was: both runs exited 0, ``metrics.jsonl`` read ``1…10 9 11 10 12 …``
and each overwrote the other's checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rlcore.commands.cli import main
from rlcore.errors import ConfigError
from rlcore.data.tasks import digits_dataset
from rlcore.testing.cli_checks import fails_before_model_load
from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer

CLI = [sys.executable, "-c", "import sys; from rlcore.commands.cli import main; main(sys.argv[1:])"]


def _wait_for(path: Path, proc: subprocess.Popen[str], seconds: float = 240.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, f"the first run ended early: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def test_a_live_runs_directory_is_refused_and_a_killed_run_leaves_no_lock(
        tmp_path: Path, tiny_model_dir: str, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "D"
    flags = ["--max_steps", "500", "--save_steps", "2", "--output_dir", str(out)]
    first = subprocess.Popen([*CLI, "train", *flags], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(out / "checkpoint-2", first)
        # the case: the same command resumed while the first one runs
        err = fails_before_model_load([*flags, "--resume_from_checkpoint", "true"], capsys, monkeypatch)
        assert err.startswith(f"Error: output_dir {out} is in use by a running run (pid {first.pid}, started "), err
        assert err.endswith("; wait for it or pick another --output_dir"), err
        # --overwrite_output_dir never deletes a live run's files
        err = fails_before_model_load([*flags, "--overwrite_output_dir", "true"], capsys, monkeypatch)
        assert "is in use by a running run" in err, err
        assert (out / "checkpoint-2").is_dir() and (out / "metrics.jsonl").exists()
        # GRPOTrainer from Python: one line, before the model loads
        args = GRPOConfig(output_dir=str(out), reward_funcs=["digits"], num_generations=2, per_device_train_batch_size=4,
                          max_completion_length=4, max_steps=1, report_to="none", plots=False, disable_tqdm=True,
                          overwrite_output_dir=True)
        import transformers

        def no_load(*a: Any, **k: Any) -> Any:  # fault injection: loading the model here is the bug
            raise AssertionError("the model was loaded for a directory another run holds")

        with monkeypatch.context() as m:
            m.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
            with pytest.raises(ConfigError, match=f"output_dir {out} is in use by a running run \\(pid {first.pid}"):
                GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(8))
        assert first.poll() is None, "the first run was disturbed"
    finally:
        first.send_signal(signal.SIGKILL)  # a crash: nothing of the run's own cleanup runs
        first.communicate(timeout=60)
    assert first.returncode == -signal.SIGKILL
    monkeypatch.undo()  # models load again
    # the killed run left no stuck lock: its checkpoints resume at once
    newest = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    main(["train", "--max_steps", str(newest + 1), "--save_steps", "2", "--output_dir", str(out),
          "--resume_from_checkpoint", "true"])
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, newest + 2)), steps  # one run's history, never two interleaved
    assert not (out / ".rlcore.lock").exists()  # a finished run leaves nothing behind


def test_the_lock_is_the_processs_and_a_finished_run_gives_it_back(tmp_path: Path) -> None:
    """A real second process cannot take a directory this process holds; the same process can
    (the CLI and the trainer both take it), and after the last release another process can."""
    from rlcore.training import checkpoint as ckpt

    out = tmp_path / "D"
    probe = [sys.executable, "-c",
             "import sys\nfrom rlcore.training.checkpoint import acquire_run_lock\n"
             "from rlcore.errors import ConfigError\n"
             "try:\n    acquire_run_lock(sys.argv[1])\nexcept ConfigError as e:\n    print(e); sys.exit(3)\n",
             str(out)]
    ckpt.acquire_run_lock(str(out))
    try:
        ckpt.acquire_run_lock(str(out))  # re-entrant in one process
        ckpt.release_run_lock(str(out))
        taken = subprocess.run(probe, capture_output=True, text=True, timeout=120)
        assert taken.returncode == 3, taken.stderr
        assert f"is in use by a running run (pid {os.getpid()}, started " in taken.stdout, taken.stdout
    finally:
        ckpt.release_run_lock(str(out))
    assert not (out / ".rlcore.lock").exists()
    free = subprocess.run(probe, capture_output=True, text=True, timeout=120)
    assert free.returncode == 0, free.stdout + free.stderr
