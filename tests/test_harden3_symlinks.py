"""Nothing is written, truncated or deleted through a symbolic link in the output directory
(issue 35, item 9). A link among its entries (or in ``plots/``) is refused in one line naming it,
before anything changes; the link and its target are left as they are. Was: a resume repaired
``metrics.jsonl`` through a link and cut the last line of a file outside the run;
``--overwrite_output_dir`` deleted the earlier run's files and then failed on a linked checkpoint."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlcore.commands.cli import main
from rlcore.errors import ConfigError
from rlcore.testing.cli_checks import fails_before_model_load
from rlcore.training.metrics import append_jsonl


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "D"
    main(["train", "--max_steps", "2", "--save_steps", "2", "--output_dir", str(out)])
    return out


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): (os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
            for p in sorted(path.rglob("*")) if p.is_symlink() or p.is_file()}


def _link_line(link: Path) -> str:
    return (f"Error: {link} is a symbolic link (to {os.readlink(link)}); rlcore never writes or deletes through a link "
            "in output_dir — remove the link (its target is left alone) or put the real file or directory there, or "
            "pick another --output_dir")


def test_resume_never_repairs_metrics_through_a_link(finished_run: Path, tmp_path: Path, capsys: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "D"
    shutil.copytree(finished_run, out)
    outside = tmp_path / "notes.jsonl"
    outside.write_bytes((out / "metrics.jsonl").read_bytes() + b'{"someone else\'s last line, unfinished')
    (out / "metrics.jsonl").unlink()
    os.symlink(outside, out / "metrics.jsonl")
    before, outside_before = _tree(out), outside.read_bytes()
    err = fails_before_model_load(["--max_steps", "3", "--output_dir", str(out), "--resume_from_checkpoint", "true"],
                                  capsys, monkeypatch)
    assert err == _link_line(out / "metrics.jsonl"), err
    assert outside.read_bytes() == outside_before and _tree(out) == before


def test_overwrite_never_deletes_through_a_linked_checkpoint(finished_run: Path, tmp_path: Path, capsys: Any,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "D"
    shutil.copytree(finished_run, out)
    elsewhere = tmp_path / "kept" / "checkpoint-2"
    elsewhere.parent.mkdir()
    shutil.move(str(out / "checkpoint-2"), elsewhere)
    os.symlink(elsewhere, out / "checkpoint-2")
    before, kept = _tree(out), _tree(elsewhere)
    err = fails_before_model_load(["--max_steps", "2", "--output_dir", str(out), "--overwrite_output_dir", "true"],
                                  capsys, monkeypatch)
    assert err == _link_line(out / "checkpoint-2"), err
    assert _tree(out) == before and _tree(elsewhere) == kept  # nothing of the earlier run was deleted first


def test_the_trainer_and_the_metrics_log_refuse_links_too(finished_run: Path, tmp_path: Path, tiny_model_dir: str) -> None:
    from rlcore.data.tasks import digits_dataset
    from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer

    out = tmp_path / "D"
    shutil.copytree(finished_run, out)
    target = tmp_path / "reward.png"
    target.write_bytes(b"a picture of someone else's")
    (out / "plots" / "reward.png").unlink()
    os.symlink(target, out / "plots" / "reward.png")
    before = _tree(out)
    args = GRPOConfig(output_dir=str(out), reward_funcs=["digits"], num_generations=2, per_device_train_batch_size=4,
                      max_completion_length=4, max_steps=1, report_to="none", disable_tqdm=True,
                      overwrite_output_dir=True, save_strategy="no")
    trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(8))
    with pytest.raises(ConfigError, match=f"^{out}/plots/reward.png is a symbolic link \\(to {target}\\)"):
        trainer.train()
    assert _tree(out) == before and target.read_bytes() == b"a picture of someone else's"
    # a link that appears while a run logs: the line is not appended to the file behind it
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text('{"step": 1}\n')
    (out / "metrics.jsonl").unlink()
    os.symlink(outside, out / "metrics.jsonl")
    with pytest.raises(ConfigError, match="metrics.jsonl is a symbolic link"):
        append_jsonl(str(out), {"step": 2, "reward": 0.5})
    assert outside.read_text() == '{"step": 1}\n'
