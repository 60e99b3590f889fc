"""A GPU recipe on a CPU (issue 34, point 6): `bf16: true` (examples/gsm8k/config.yaml) stopped with
transformers' `Your setup doesn't support bf16/gpu. You need to assign use_cpu …`; it now trains in
float32 and the header says so in one line, naming `--bf16 false`."""

from __future__ import annotations

from typing import Any

import pytest

from rlcore.commands.cli import main
from rlcore.commands.train import build_plan


@pytest.fixture
def no_bf16_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine, as far as rlcore's check goes, has no device that supports bf16 (a CPU)."""
    import transformers.utils

    monkeypatch.setattr(transformers.utils, "is_torch_bf16_gpu_available", lambda *a, **k: False)
    monkeypatch.setattr(transformers.utils, "is_torch_xla_available", lambda *a, **k: False)


def test_a_bf16_config_falls_back_on_a_cpu_and_says_so(tmp_path: Any, capsys: Any, no_bf16_device: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text("bf16: true\nmax_steps: 1\nper_device_train_batch_size: 8\nnum_generations: 4\n"
                   "max_completion_length: 4\nsave_strategy: \"no\"\n")
    monkeypatch.setenv("COLUMNS", "300")
    main(["train", "--config", str(cfg), "--output-dir", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert "⚠ bf16 is on, but this machine has no GPU that supports bf16: training in float32 (pass --bf16 false" in out
    assert "done" in out


def test_bf16_false_or_no_bf16_says_nothing(tmp_path: Any, no_bf16_device: None) -> None:
    assert build_plan(["--bf16", "false", "--output-dir", str(tmp_path / "a")]).notes == []
    assert build_plan(["--output-dir", str(tmp_path / "b")]).notes == []
    plan = build_plan(["--bf16", "true", "--output-dir", str(tmp_path / "c")])
    assert plan.args.bf16 is False and "--bf16 false" in plan.notes[0]
