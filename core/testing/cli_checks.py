"""Checking a command the way a user meets it: a mistake is one line, reported before any model loads."""

from __future__ import annotations

from typing import Any

import pytest


def fails_before_model_load(argv: list[str], capsys: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run ``rlcore train ARGV`` with model loading turned into a failure (loading a model before the
    arguments are checked is the bug); assert it exits 2 with one ``Error: …`` line, and return it."""
    import transformers

    from ..commands.cli import main

    def no_load(*a: Any, **k: Any) -> Any:  # fault injection: loading a model here is the bug
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    with pytest.raises(SystemExit) as exc:
        main(["train", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("Error: ") and "\n" not in err, err
    return err
