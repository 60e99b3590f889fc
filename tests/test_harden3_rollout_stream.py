"""Issue 35 item 3: `rlcore rollout` streams each finished trajectory to --output (flushed), keeps
none of them in memory, checks the destination before the model loads, refuses to replace a file
without --overwrite, and on Ctrl-C keeps what finished (one line, exit 130)."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import pytest

from rlcore.commands.cli import main

FAST = ["--max-tokens", "2", "--no-progress"]


def _no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlcore.sampling.hf.sampler as hf

    def no_load(*a: Any, **k: Any) -> Any:  # fault injection: loading the model here is the bug
        raise AssertionError("the sampler loaded before --output was checked")

    monkeypatch.setattr(hf.HFSampler, "__init__", no_load)


def _one_line_error(argv: list[str], capsys: Any) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["rollout", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("Error: ") and "\n" not in err, err
    return err


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Any:
    """A real read-only filesystem (root ignores permission bits, not a read-only mount)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True)
    if res.returncode:
        if os.geteuid() != 0:
            os.chmod(ro, 0o555)  # an unprivileged user: permission bits are as real
            yield ro
            os.chmod(ro, 0o755)
            return
        pytest.skip(f"cannot mount a read-only tmpfs here: {res.stderr.decode().strip()}")
    try:
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], check=False)


@pytest.mark.parametrize("case", ["directory", "missing parent", "parent is a file", "read-only"])
def test_a_bad_destination_is_one_line_before_the_model_loads(
        case: str, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch, request: Any) -> None:
    """Was: a ~39-line traceback after all the work (or, a missing parent, a directory made silently)."""
    _no_model_load(monkeypatch)
    if case == "directory":
        out, needle = tmp_path, f"--output {tmp_path} is a directory"
    elif case == "missing parent":
        out, needle = tmp_path / "no" / "r.jsonl", f"{tmp_path / 'no'} does not exist"
    elif case == "parent is a file":
        (tmp_path / "f").write_text("x")
        out, needle = tmp_path / "f" / "r.jsonl", f"{tmp_path / 'f'} is not a directory"
    else:
        ro = request.getfixturevalue("read_only_dir")
        out, needle = ro / "r.jsonl", f"cannot write in {ro}"
    err = _one_line_error([*FAST, "-o", str(out)], capsys)
    assert needle in err and "--output" in err
    assert not (tmp_path / "no").exists()


def test_an_existing_file_is_kept_unless_overwrite(tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: replaced without a word."""
    out = tmp_path / "r.jsonl"
    out.write_text("precious\n")
    with monkeypatch.context() as m:
        _no_model_load(m)
        err = _one_line_error([*FAST, "-o", str(out)], capsys)
    assert err == f"Error: --output {out} already exists; pass --overwrite to replace it, or pick another --output"
    assert out.read_text() == "precious\n"
    main(["rollout", "--limit", "2", *FAST, "-o", str(out), "--overwrite"])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 2 and all(d["status"] in ("ok", "truncated") for d in lines)
    assert f"wrote 2 trajectories to {out}" in capsys.readouterr().err


def test_a_write_error_mid_run_is_one_line_naming_the_file(capsys: Any) -> None:
    """/dev/full: every write fails with ENOSPC. Was: an OSError traceback after all the work."""
    err = _one_line_error(["--limit", "2", *FAST, "-o", "/dev/full"], capsys)
    assert err.startswith("Error: cannot write /dev/full: No space left on device"), err


def test_every_trajectory_failed_still_writes_the_file(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "r.jsonl"
    err = _one_line_error(["--limit", "3", *FAST, "--timeout", "0.000001", "-o", str(out)], capsys)
    assert err.startswith("Error: no trajectory succeeded: wrote 3 trajectories")
    assert [json.loads(x)["status"] for x in out.read_text().splitlines()] == ["failed"] * 3


def test_ctrl_c_keeps_the_finished_trajectories_and_says_how_many(tmp_path: Path) -> None:
    """A real SIGINT into a long run. Was: nothing written at all (the file opened only at the end)."""
    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from rlcore.commands.cli import main; main()", "rollout", "--limit", "0",
         "--num-generations", "2000", "--rollout-concurrency", "4", *FAST, "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_text().count("\n") >= 5:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        assert out.exists() and out.read_text().count("\n") >= 5, "nothing was written while the run went on"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    lines = out.read_text().splitlines()
    assert len(lines) >= 5 and all(json.loads(x)["status"] in ("ok", "truncated") for x in lines)
    last = err.strip().splitlines()[-1]
    assert last == f"interrupted: wrote {len(lines)} finished trajectories to {out}", err
    assert "Traceback" not in err and "Aborted" not in err


class _Watch:
    """Weak references to every trajectory of a run, and the finished ones alive at a moment."""

    refs: list[weakref.ref[Any]] = []
    alive_finished: list[int] = []
    calls = 0


def _watching_scheduler() -> type:
    from rlcore.rollout.scheduler import RolloutScheduler

    class WatchingScheduler(RolloutScheduler):
        async def on_trajectory_start(self, trajectories: list[Any]) -> None:
            _Watch.refs = [weakref.ref(t) for t in trajectories]

        async def run(self, infer_request: Any, request_config: Any = None) -> Any:
            _Watch.calls += 1
            if _Watch.calls % 50 == 0:  # how many finished ones are still held, every 50 trajectories
                gc.collect()
                _Watch.alive_finished.append(sum(1 for r in _Watch.refs if (t := r()) is not None and t.status != "running"))
            return await super().run(infer_request, request_config)

    return WatchingScheduler


def test_finished_trajectories_are_not_kept_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: every trajectory held to the end (433 MB and rising at 4,000). Counted, not timed: the
    finished trajectories still alive mid-run stay within the concurrency however long the run."""
    from rlcore.testing.packages import load_in_process

    load_in_process(monkeypatch, "watching_scheduler_plugin_t",
                    register_schedulers=lambda register: register("watching_t", _watching_scheduler()))
    _Watch.alive_finished, _Watch.calls = [], 0
    out = tmp_path / "r.jsonl"
    main(["rollout", "--scheduler", "watching_t", "--limit", "0", "--num-generations", "6", "--rollout-concurrency", "4",
          *FAST, "-o", str(out)])
    n = len(out.read_text().splitlines())
    assert n >= 250 and len(_Watch.alive_finished) >= 4, (n, _Watch.alive_finished)
    assert max(_Watch.alive_finished) <= 8, _Watch.alive_finished  # old code: 50, 100, 150, … (all of them)


async def test_the_driver_streams_and_stops_cleanly_when_the_consumer_fails(tiny_tokenizer: Any) -> None:
    """run_rollouts(on_finished=…): trajectories handed on as they end, none kept; a consumer that
    raises stops the run, every started trajectory still gets its on_trajectory_end."""
    from rlcore.rollout import run_rollouts
    from rlcore.rollout.scheduler import RolloutScheduler
    from rlcore.testing import ScriptedSampler
    from rlcore.types import Prompt, SamplingParams

    ended: list[str] = []

    class Ending(RolloutScheduler):
        async def on_trajectory_end(self, trajectory: Any) -> None:
            ended.append(trajectory.uuid)

    prompts = [Prompt(messages=[{"role": "user", "content": "hi"}], prompt_ids=tiny_tokenizer.encode("hi")) for _ in range(6)]
    got: list[Any] = []
    sched = Ending(ScriptedSampler(["ok"], tiny_tokenizer, delay=0.01), tokenizer=tiny_tokenizer)
    result = await run_rollouts(sched, prompts, num_generations=2, sampling_params=SamplingParams(max_tokens=4),
                                concurrency=3, progress=False, on_finished=got.extend)
    assert result.trajectories == [] and result.stats["trajectories"] == 12 == len(got) == len(ended)
    assert result.stats["ok"] + result.stats["truncated"] == 12

    ended.clear()

    def broken(trajs: list[Any]) -> None:
        raise OSError(28, "No space left on device")

    sched = Ending(ScriptedSampler(["ok"], tiny_tokenizer, delay=0.05), tokenizer=tiny_tokenizer)
    with pytest.raises(OSError, match="No space"):
        await run_rollouts(sched, prompts, num_generations=2, sampling_params=SamplingParams(max_tokens=4),
                           concurrency=3, progress=False, on_finished=broken)
    assert 3 <= len(ended) < 12  # the ones in flight ended (cancelled), the rest never started
