"""Issue 35 item 13: startup never hangs on a chat template that loops, and commands that need no
plugin do not wait for a slow one to import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlcore.testing.packages import write_site_plugin

SLOW_PLUGIN = '''
import time

time.sleep(120)  # a plugin whose import takes two minutes (it builds a cache, loads a model …)
'''

LOOP = "{%- for i in range(100000) %}{%- for j in range(100000) %}{%- endfor %}{%- endfor %}"


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, COLUMNS="200", **extra)


@pytest.mark.parametrize("args", [["--version"], ["--help"], []])
def test_version_and_help_do_not_import_plugins(tmp_path, args):
    dist = "rlcore-h3-slow"
    site = write_site_plugin(tmp_path / "site", dist, "rlcore_h3_slow", SLOW_PLUGIN)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "rlcore.commands.cli", *args], capture_output=True, text=True, cwd=tmp_path,
                            env=_env(PYTHONPATH=os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p),
                                     RLCORE_PLUGINS=dist), timeout=60)
    assert time.monotonic() - started < 45  # the plugin's import alone takes 120 s
    assert result.returncode == (0 if args else 2), result.stderr  # bare `rlcore`: click's help, exit 2
    if args == ["--version"]:
        assert "version" in result.stdout
    else:
        shown = result.stdout + result.stderr
        assert "train" in shown and "Installed plugins may add commands" in shown


def _looping_model(tmp_path: Path, tiny_model_dir: str) -> Path:
    model = tmp_path / "looping-model"
    shutil.copytree(tiny_model_dir, model)
    template = model / "chat_template.jinja"
    template.write_text(LOOP + template.read_text())
    return model


def test_rlcore_train_with_a_looping_chat_template_fails_in_one_line(tmp_path, tiny_model_dir):
    model = _looping_model(tmp_path, tiny_model_dir)
    result = subprocess.run(
        [sys.executable, "-m", "rlcore.commands.cli", "train", "--model", str(model), "--max_steps", "1",
         "--output_dir", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=tmp_path, env=_env(RLCORE_TEMPLATE_TIMEOUT="2", RLCORE_PLUGINS=""),
        timeout=400)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == (
        f"Error: the chat template ({model}/chat_template.jinja) did not finish rendering a short conversation within "
        "2 s (a loop that never ends?); fix the template, or pass one with --chat-template FILE "
        "(RLCORE_TEMPLATE_TIMEOUT sets the bound)")


@pytest.mark.timeout(120, method="thread")  # the old code hangs here: fail, never wait forever
def test_the_first_renders_are_bounded_in_process_and_leave_an_earlier_timer_running(tmp_path, tiny_model_dir):
    import signal

    from transformers import AutoTokenizer

    from rlcore.chat_template import ChatTemplateError, check_renders_in_time, prepare_multi_turn

    tok = AutoTokenizer.from_pretrained(str(_looping_model(tmp_path, tiny_model_dir)))
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    signal.setitimer(signal.ITIMER_REAL, 30.0)  # somebody's timer, set before the check
    try:
        started = time.monotonic()
        with pytest.raises(ChatTemplateError, match=r"chat_template\.jinja\) did not finish rendering .* within 1 s"):
            check_renders_in_time(tok, timeout=1)
        assert time.monotonic() - started < 10
        remaining = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 15 < remaining <= 30  # the earlier timer still runs, with the time it had left
        assert not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    os.environ["RLCORE_TEMPLATE_TIMEOUT"] = "1"
    try:  # the trainer's first render of the template (before the model loads) is the bounded one
        with pytest.raises(ChatTemplateError, match="did not finish rendering"):
            prepare_multi_turn(tok, "per_turn")
    finally:
        del os.environ["RLCORE_TEMPLATE_TIMEOUT"]


def test_a_template_that_renders_leaves_the_alarm_as_it_was(tiny_tokenizer):
    import signal

    from rlcore.chat_template import check_renders_in_time

    def handler(*a):
        raise AssertionError("no alarm was due")

    previous = signal.signal(signal.SIGALRM, handler)
    saved = signal.setitimer(signal.ITIMER_REAL, 0)  # (pytest-timeout's, while this test runs)
    try:
        check_renders_in_time(tiny_tokenizer, timeout=5)
        assert signal.getsignal(signal.SIGALRM) is handler
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGALRM, previous)
        signal.setitimer(signal.ITIMER_REAL, *saved)
