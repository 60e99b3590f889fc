"""Issue 35 item 7: a plugin that exits or interrupts at import, or registers a non-callable.

The broken plugins are really installed: a module and its ``.dist-info`` (entry point in the
``rlcore`` group) in a temporary site directory, on ``PYTHONPATH`` of a real ``rlcore`` process (or
on ``sys.path`` of this one), found by importlib.metadata like any installed distribution.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlcore.testing.cli_checks import fails_before_model_load
from rlcore.testing.packages import write_site_plugin

EXIT_PLUGIN = '''
import sys

sys.exit("rlcore-h3-exit needs the foo driver; install it")
'''

INTERRUPT_PLUGIN = '''
raise KeyboardInterrupt
'''

SLOW_PLUGIN = '''
import os
import time

open(os.environ["H3_MARKER"], "w").close()  # the test's cue: the import has started
time.sleep(120)
'''

NUMBER_REWARD_PLUGIN = '''
import rlcore

NUMBER = 42


def fine(completions, **kwargs):
    return [0.0 for _ in completions]


@rlcore.hookimpl
def register_rewards(register):
    register("h3_fine_reward", fine)
    register("h3_number_reward", 42)
'''

LAZY_NUMBER_PLUGIN = '''
import rlcore

NUMBER = 42


@rlcore.hookimpl
def register_rewards(register):
    register("h3_lazy_number", "rlcore_h3_lazy:NUMBER")
'''


def rlcore_run(args: list[str], site: Path, allow: str, cwd: Path, timeout: float = 300,
               **env: str) -> subprocess.CompletedProcess[str]:
    """``rlcore ARGS`` in a fresh process that has ``site`` on its path and loads ``allow``'s plugins."""
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p),
                RLCORE_PLUGINS=allow, COLUMNS="200", **env)
    return subprocess.run([sys.executable, "-m", "rlcore.commands.cli", *args], capture_output=True, text=True, env=full,
                          cwd=cwd, timeout=timeout)


def _row(result: subprocess.CompletedProcess[str], dist: str) -> dict:
    assert result.returncode == 0, result.stderr
    (row,) = [r for r in json.loads(result.stdout) if r["distribution"] == dist]
    return row


def test_sys_exit_at_import_is_that_plugins_error_row_and_takes_no_command_down(tmp_path):
    dist = "rlcore-h3-exit"
    site = write_site_plugin(tmp_path / "site", dist, "rlcore_h3_exit", EXIT_PLUGIN)

    version = rlcore_run(["--version"], site, dist, tmp_path)
    assert version.returncode == 0 and "version" in version.stdout, version.stderr

    row = _row(rlcore_run(["plugins", "--json"], site, dist, tmp_path), dist)
    assert row["error"] == ("SystemExit: the plugin called sys.exit('rlcore-h3-exit needs the foo driver; "
                            "install it') while loading")
    table = rlcore_run(["plugins"], site, dist, tmp_path)
    assert table.returncode == 0 and dist in table.stdout and "sys.exit" in table.stdout

    # a run that names what the plugin would have registered: one line naming the plugin and its exit
    named = rlcore_run(["train", "--reward", "h3_exit_reward", "--max_steps", "1"], site, dist, tmp_path)
    assert named.returncode == 2
    err = named.stderr.strip()
    assert err.startswith("Error: ") and "\n" not in err, err
    assert "h3_exit_reward" in err and f"{dist}: SystemExit: the plugin called sys.exit(" in err

    # a run that does not name it is unaffected: it trains and finishes
    run = rlcore_run(["train", "--max_steps", "1", "--output_dir", str(tmp_path / "out"), "--plots", "false"],
                     site, dist, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "done" in run.stdout and (tmp_path / "out" / "metrics.jsonl").is_file()


def test_keyboard_interrupt_raised_by_a_plugin_at_import_is_its_error_row(tmp_path):
    dist = "rlcore-h3-interrupt"
    site = write_site_plugin(tmp_path / "site", dist, "rlcore_h3_interrupt", INTERRUPT_PLUGIN)
    row = _row(rlcore_run(["plugins", "--json"], site, dist, tmp_path), dist)
    assert row["error"] == "KeyboardInterrupt: raised by the plugin itself while loading (not a Ctrl-C)"
    listed = rlcore_run(["components", "reward"], site, dist, tmp_path)
    assert listed.returncode == 0 and "digits" in listed.stdout and "Traceback" not in listed.stderr


def test_a_real_ctrl_c_while_a_slow_plugin_imports_still_stops_the_command(tmp_path):
    dist = "rlcore-h3-slow-import"
    site = write_site_plugin(tmp_path / "site", dist, "rlcore_h3_slow_import", SLOW_PLUGIN)
    marker = tmp_path / "importing"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p),
               RLCORE_PLUGINS=dist, H3_MARKER=str(marker))
    proc = subprocess.Popen([sys.executable, "-m", "rlcore.commands.cli", "plugins"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.strip() == "Aborted.", err


@pytest.fixture
def site_plugin_loaded(tmp_path):
    """Install a plugin into a temporary site directory on this process's ``sys.path`` and load it."""
    import importlib

    import rlcore

    added: list[str] = []
    before = os.environ.get("RLCORE_PLUGINS")

    def load(dist: str, module: str, source: str) -> None:
        site = write_site_plugin(tmp_path / "site", dist, module, source)
        if str(site) not in sys.path:
            sys.path.insert(0, str(site))
            added.append(str(site))
        os.environ["RLCORE_PLUGINS"] = dist
        importlib.invalidate_caches()
        rlcore.reload_plugins()

    yield load
    for path in added:
        sys.path.remove(path)
    for name in [m for m in sys.modules if m.startswith("rlcore_h3_")]:
        del sys.modules[name]
    if before is None:
        os.environ.pop("RLCORE_PLUGINS", None)
    else:
        os.environ["RLCORE_PLUGINS"] = before
    rlcore.reload_plugins()


def test_a_non_callable_reward_is_refused_when_it_registers(site_plugin_loaded, capsys, monkeypatch):
    import rlcore

    dist = "rlcore-h3-number"
    site_plugin_loaded(dist, "rlcore_h3_number", NUMBER_REWARD_PLUGIN)
    (rec,) = [r for r in rlcore.plugins().list() if r.dist == dist]
    assert rec.error == (f"register_rewards raised PluginError: {dist} registered reward 'h3_number_reward' as 42 "
                         "(int), which is not callable; register a function or class (or a 'module:attr' string "
                         "naming one)")
    assert "h3_number_reward" not in rlcore.available("reward")
    err = fails_before_model_load(["--reward", "h3_number_reward", "--max_steps", "1"], capsys, monkeypatch)
    assert "h3_number_reward" in err and dist in err and "registered reward 'h3_number_reward' as 42 (int)" in err


def test_a_module_attr_string_naming_a_non_callable_is_one_line_when_the_run_names_it(site_plugin_loaded, capsys,
                                                                                      monkeypatch):
    dist = "rlcore-h3-lazy"
    site_plugin_loaded(dist, "rlcore_h3_lazy", LAZY_NUMBER_PLUGIN)
    err = fails_before_model_load(["--reward", "h3_lazy_number", "--max_steps", "1"], capsys, monkeypatch)
    assert err == (f"Error: reward 'h3_lazy_number' from {dist} is rlcore_h3_lazy:NUMBER, which is 42 (int), "
                   "not a function or class")
