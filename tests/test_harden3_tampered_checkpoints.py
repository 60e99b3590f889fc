"""A damaged checkpoint is one line before the model loads (issue 35, item 8): a resume validates
the checkpoint first — required files, sizes, JSON types, safetensors and torch files complete,
bounded reads — and names what is wrong and the newest earlier checkpoint that is intact. A
missing optimizer (or LR-scheduler, or RNG) state is refused unless the user asks to go on without
it (``--resume-without-optimizer-state``). Was: 42–55-line tracebacks after the model loaded;
"written by a run without a run id" for a missing ``rlcore_state.json``; a silent resume with a
fresh optimizer; a state file linked to ``/dev/zero`` read until ``MemoryError``."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from rlcore.commands.cli import main
from rlcore.errors import ConfigError
from rlcore.testing.cli_checks import fails_before_model_load

CLI = [sys.executable, "-c", "import sys; from rlcore.commands.cli import main; main(sys.argv[1:])"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run with checkpoint-2 and checkpoint-4 (each test tampers with a copy)."""
    out = tmp_path_factory.mktemp("run") / "D"
    main(["train", "--max_steps", "4", "--save_steps", "2", "--output_dir", str(out)])
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "D"
    shutil.copytree(run, out, symlinks=True)
    return out


def _cut(name: str) -> Callable[[Path], None]:
    def go(ck: Path) -> None:
        os.truncate(ck / name, (ck / name).stat().st_size // 2)
    return go


def _write(name: str, text: str) -> Callable[[Path], None]:
    return lambda ck: (ck / name).write_text(text)


def _remove(name: str) -> Callable[[Path], None]:
    return lambda ck: (ck / name).unlink()


DAMAGE = {
    "truncated model.safetensors": (_cut("model.safetensors"), "model.safetensors is truncated ("),
    "truncated optimizer.pt": (_cut("optimizer.pt"), "optimizer.pt is truncated or not a file torch.save wrote"),
    "garbage trainer_state.json": (_write("trainer_state.json", "{garbage"), "trainer_state.json is not valid JSON"),
    "wrong-typed global_step": (_write("trainer_state.json", json.dumps({"global_step": "4", "log_history": []})),
                                'trainer_state.json: global_step is "4", not an integer'),
    "wrong-typed log_history": (_write("trainer_state.json", json.dumps({"global_step": 4, "log_history": {"a": 1}})),
                                "trainer_state.json: log_history is {\"a\": 1}, not a list of objects"),
    "a list for a trainer state": (_write("trainer_state.json", "[4]"), "trainer_state.json holds list, not a JSON object"),
    "missing rlcore_state.json": (_remove("rlcore_state.json"), "rlcore_state.json (rlcore's data position and run id) is missing"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_checkpoint_is_one_line_naming_the_intact_one(
        case: str, finished_run: Path, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _copy(finished_run, tmp_path)
    damage, said = DAMAGE[case]
    damage(out / "checkpoint-4")
    for resume in ("true", str(out / "checkpoint-4")):
        err = fails_before_model_load(["--max_steps", "6", "--output_dir", str(out), "--resume_from_checkpoint", resume],
                                      capsys, monkeypatch)
        assert err.startswith(f"Error: {out}/checkpoint-4 is damaged: {said}"), err
        assert err.endswith(f"; the newest intact checkpoint is {out}/checkpoint-2 (--resume_from_checkpoint "
                            f"{out}/checkpoint-2)"), err
    assert not (out / "checkpoint-6").exists() and not (out / "checkpoint-5").exists()


def test_no_intact_checkpoint_is_said_too(finished_run: Path, tmp_path: Path, capsys: Any,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = _copy(finished_run, tmp_path)
    for step in (2, 4):
        _cut("model.safetensors")(out / f"checkpoint-{step}")
    err = fails_before_model_load(["--output_dir", str(out), "--resume_from_checkpoint", "true"], capsys, monkeypatch)
    size = (finished_run / "checkpoint-4" / "model.safetensors").stat().st_size
    assert err == (f"Error: {out}/checkpoint-4 is damaged: model.safetensors is truncated ({size // 2} bytes; its "
                   f"header says {size}); no earlier checkpoint in {out} is intact"), err


@pytest.mark.parametrize("name", ["optimizer.pt", "rng_state.pth", "scheduler.pt"])
def test_a_missing_optimizer_state_is_refused_unless_asked_for(
        name: str, finished_run: Path, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _copy(finished_run, tmp_path)
    (out / "checkpoint-4" / name).unlink()
    err = fails_before_model_load(["--max_steps", "5", "--output_dir", str(out), "--resume_from_checkpoint", "true"],
                                  capsys, monkeypatch)
    assert err == (f"Error: {out}/checkpoint-4 has no {name} (the optimizer, LR-scheduler and RNG state a resume "
                   "continues with); pass --resume-without-optimizer-state true to go on with a fresh optimizer, LR "
                   f"schedule and RNG, or resume {out}/checkpoint-2, which has them"), err


def test_resume_without_optimizer_state_goes_on(finished_run: Path, tmp_path: Path, caplog: Any) -> None:
    out = _copy(finished_run, tmp_path)
    (out / "checkpoint-4" / "optimizer.pt").unlink()
    main(["train", "--max_steps", "5", "--output_dir", str(out), "--resume_from_checkpoint", "true",
          "--resume-without-optimizer-state", "true", "--save_strategy", "no"])
    assert f"{out}/checkpoint-4 has no optimizer.pt: resuming with a fresh optimizer" in caplog.text
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5], steps


def test_the_python_api_validates_too(finished_run: Path, tmp_path: Path, tiny_model_dir: str) -> None:
    from rlcore.data.tasks import digits_dataset
    from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer

    out = _copy(finished_run, tmp_path)
    _cut("optimizer.pt")(out / "checkpoint-4")
    before = (out / "metrics.jsonl").read_bytes()
    args = GRPOConfig(output_dir=str(out), reward_funcs=["digits"], num_generations=2, per_device_train_batch_size=4,
                      max_completion_length=4, max_steps=6, report_to="none", plots=False, disable_tqdm=True)
    trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(8))
    with pytest.raises(ConfigError, match="checkpoint-4 is damaged: optimizer.pt is truncated"):
        trainer.train(resume_from_checkpoint=True)
    assert (out / "metrics.jsonl").read_bytes() == before  # nothing was cut or written


def _address_space(limit: int) -> Callable[[], None]:
    def pre() -> None:  # a runaway read in the child stops at `limit` bytes instead of eating the machine
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return pre


def test_a_state_file_linked_to_dev_zero_is_not_read(finished_run: Path, tmp_path: Path) -> None:
    """In a child process under a 4 GiB address-space cap: the unbounded read this replaces ran
    until MemoryError."""
    out = _copy(finished_run, tmp_path)
    (out / "checkpoint-4" / "rlcore_state.json").unlink()
    os.symlink("/dev/zero", out / "checkpoint-4" / "rlcore_state.json")
    proc = subprocess.run([*CLI, "train", "--output_dir", str(out), "--resume_from_checkpoint", str(out / "checkpoint-4")],
                          capture_output=True, text=True, timeout=300, preexec_fn=_address_space(4 << 30))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip() == (f"Error: {out}/checkpoint-4 is damaged: rlcore_state.json is not a regular file (a "
                                   f"link to /dev/zero); the newest intact checkpoint is {out}/checkpoint-2 "
                                   f"(--resume_from_checkpoint {out}/checkpoint-2)"), proc.stderr[-3000:]


def test_a_trainer_state_linked_to_dev_zero_is_not_read(finished_run: Path, tmp_path: Path, capsys: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: `is not a checkpoint (no trainer_state.json)` for a file that is there (and, with
    `true`, a read until MemoryError)."""
    out = _copy(finished_run, tmp_path)
    (out / "checkpoint-4" / "trainer_state.json").unlink()
    os.symlink("/dev/zero", out / "checkpoint-4" / "trainer_state.json")
    err = fails_before_model_load(["--output_dir", str(out), "--resume_from_checkpoint", str(out / "checkpoint-4")],
                                  capsys, monkeypatch)
    assert err.startswith(f"Error: {out}/checkpoint-4 is damaged: trainer_state.json is not a regular file (a link "
                          "to /dev/zero); the newest intact checkpoint is "), err
