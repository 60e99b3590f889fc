"""No room to write (issue 35, item 5): a checkpoint or a ``metrics.jsonl`` line that does not fit
is one line naming the file, the space and the last complete checkpoint; the partial
``.incomplete-checkpoint-*`` is removed, no 0-byte or cut PNG is left, ``metrics.jsonl`` keeps
whole lines, and the previous checkpoint still resumes. Was: 121- and 53-line tracebacks, a
0-byte ``reward.png`` and the partial checkpoint left behind.

The full disk is real: a file size limit (``RLIMIT_FSIZE``, with SIGXFSZ ignored so a write past it
fails with EFBIG) set in the child process, and, where this machine lets us mount one, a 3 MiB tmpfs
(ENOSPC), the issue's own reproduction."""

from __future__ import annotations

import gc
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from rlcore.commands.cli import main

CLI = [sys.executable, "-c", "import sys; from rlcore.commands.cli import main; main(sys.argv[1:])"]


def _file_size_limit(limit: int) -> Callable[[], None]:
    def pre() -> None:  # in the child: a write past `limit` bytes fails (EFBIG) instead of killing it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


def _train(args: list[str], preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "train", *args], capture_output=True, text=True, timeout=600, preexec_fn=preexec)


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def _no_partial_files(out: Path) -> None:
    assert not [p.name for p in out.iterdir() if p.name.startswith(".incomplete-checkpoint-")], os.listdir(out)
    pngs = list((out / "plots").glob("*")) if (out / "plots").is_dir() else []
    for png in pngs:  # a plot is written whole or not at all
        assert png.suffix == ".png" and png.stat().st_size > 0 and png.read_bytes()[-8:] == b"IEND\xaeB`\x82", png


def test_a_checkpoint_that_does_not_fit_is_one_line_and_the_last_one_resumes(tmp_path: Path) -> None:
    out = tmp_path / "D"
    main(["train", "--max_steps", "2", "--save_steps", "2", "--output_dir", str(out)])
    before = {p.name: p.read_bytes() for p in (out / "checkpoint-2").iterdir()}
    # optimizer.pt (1.3 MB) no longer fits; model.safetensors (0.7 MB) and the rest still do
    proc = _train(["--max_steps", "4", "--save_steps", "2", "--output_dir", str(out), "--resume_from_checkpoint", "true"],
                  _file_size_limit(1_000_000))
    err = _one_line_error(proc)
    assert err.startswith(f"Error: no space left writing {out}/checkpoint-4/optimizer.pt: the file size limit "
                          "(ulimit -f) of 976.6 KiB is reached ("), err
    assert err.endswith(f"; the last complete checkpoint is {out}/checkpoint-2 (free some space, then resume with "
                        "--resume_from_checkpoint true)"), err
    _no_partial_files(out)
    assert not (out / "checkpoint-4").exists()
    assert {p.name: p.read_bytes() for p in (out / "checkpoint-2").iterdir()} == before  # intact
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4], steps
    # room again: the run resumes from checkpoint-2 and logs steps 3 and 4 once
    main(["train", "--max_steps", "4", "--save_steps", "2", "--output_dir", str(out), "--resume_from_checkpoint", "true"])
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4] and (out / "checkpoint-4" / "optimizer.pt").exists(), steps


def test_a_metrics_line_that_does_not_fit_is_one_line_and_no_torn_line(tmp_path: Path, tiny_model_dir: str) -> None:
    out = tmp_path / "D"
    proc = _train(["--max_steps", "6", "--save_strategy", "no", "--output_dir", str(out)], _file_size_limit(4096))
    err = _one_line_error(proc)
    assert err.startswith(f"Error: no space left writing {out}/metrics.jsonl: the file size limit (ulimit -f) of "
                          "4.0 KiB is reached ("), err
    assert err.endswith("; no checkpoint is complete, so there is nothing to resume — free some space and start the "
                        "run again (--overwrite_output_dir true)"), err
    text = (out / "metrics.jsonl").read_text()
    assert text.endswith("\n") and len(text) < 4096
    steps = [json.loads(line)["step"] for line in text.splitlines()]  # every line whole
    assert steps == list(range(1, len(steps) + 1)) and 1 <= len(steps) < 6, steps
    _no_partial_files(out)  # the plots (25 KB each) did not fit either: none left cut


def _mount_tmpfs(where: Path) -> bool:
    where.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], capture_output=True).returncode == 0


def test_a_full_tmpfs_the_issues_reproduction(tmp_path: Path, capsys: Any) -> None:
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk):
        pytest.skip("cannot mount a tmpfs here (not root, or no mount permission); the file size limit tests stand in")
    try:
        out = disk / "D"
        with pytest.raises(SystemExit) as exc:  # checkpoint-2 (2.1 MiB) fits, checkpoint-4 does not
            main(["train", "--max_steps", "4", "--save_steps", "2", "--output_dir", str(out)])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err, err
        line = [x for x in err.splitlines() if x.startswith("Error: ")]
        assert len(line) == 1 and line[0].startswith(f"Error: no space left writing {out}/checkpoint-4/"), err
        assert " free; the last complete checkpoint is " f"{out}/checkpoint-2 (" in line[0], line
        _no_partial_files(out)
        assert (out / "checkpoint-2" / "optimizer.pt").exists()
    finally:
        from rlcore.training.checkpoint import release_run_lock

        release_run_lock(str(out))  # in-process, the failed CLI run's lock stays this process's until it ends
        exc = None  # the traceback's frames hold the cut files open; a busy tmpfs is detached lazily
        gc.collect()
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
