"""``rlcore new plugin``: names are validated, nothing is overwritten, and every kind's generated
package installs, shows up in ``rlcore plugins`` and passes its own tests against the real core."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlcore import ConfigError
from rlcore.hookspecs import KIND_OF_HOOK
from rlcore.commands.scaffold import SCAFFOLD_KINDS, new_plugin, template_values
from rlcore.testing.packages import pip

HOOK_OF_KIND = {kind: hook for hook, kind in KIND_OF_HOOK.items()}


def _rlcore(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlcore.commands.cli", *args],
        capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd, timeout=300,
    )


@pytest.mark.parametrize("bad", ["", "MyReward", "1st", "my-reward", "my reward", "a__b", "trailing_", "x" * 80, "class", "lambda"])
def test_invalid_names_are_one_clear_error(bad, tmp_path):
    with pytest.raises(ConfigError, match="invalid plugin name") as info:
        new_plugin("reward", bad, tmp_path)
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_unknown_kind(tmp_path):
    with pytest.raises(ConfigError, match="kinds are: scheduler, env, reward, loss, advantage, sampler"):
        new_plugin("widget", "my_widget", tmp_path)


def test_refuses_to_overwrite(tmp_path):
    first = new_plugin("reward", "twice", tmp_path)
    marker = first / "README.md"
    marker.write_text("mine")
    with pytest.raises(ConfigError, match="already exists"):
        new_plugin("loss", "twice", tmp_path)
    assert marker.read_text() == "mine"


def test_refuses_a_name_the_kind_already_has(tmp_path):
    with pytest.raises(ConfigError, match="'env_reward' is already registered by rlcore"):
        new_plugin("reward", "env_reward", tmp_path)


def test_builtin_names_do_not_shadow_inside_the_module():
    assert template_values("reward", "sum")["func"] == "sum_reward"
    assert template_values("reward", "exact_match")["func"] == "exact_match"
    assert template_values("env", "word_game")["Class"] == "WordGameEnv"
    assert template_values("loss", "torch")["func"] == "torch_loss"  # loss.py imports torch
    assert template_values("env", "env")["Class"] == "MyEnv"  # not ``class Env(Env)``
    assert template_values("sampler", "sampler")["Class"] == "MySampler"


@pytest.mark.parametrize("kind", list(SCAFFOLD_KINDS))
def test_every_kind_renders_to_valid_python(kind, tmp_path):
    root = new_plugin(kind, f"demo_{kind}", tmp_path)
    values = template_values(kind, f"demo_{kind}")
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert {"pyproject.toml", "README.md", f"{values['pkg']}/__init__.py"} <= set(files)
    assert "tests/conftest.py" not in files  # the fixtures come from rlcore's pytest plugin, not a copy
    assert any(f.startswith("tests/test_") and f != "tests/test_registration.py" for f in files), files
    for rel in files:
        text = (root / rel).read_text()
        assert "{{" not in text and "__pkg__" not in rel + text, rel
        if rel.endswith(".py"):
            compile(text, rel, "exec")  # a SyntaxError fails the test
    pyproject = (root / "pyproject.toml").read_text()
    assert f'[project.entry-points.rlcore]\ndemo_{kind} = "{values["pkg"]}"' in pyproject
    assert f'[project.entry-points."rlcore.components"]\ndemo_{kind} = "{values["pkg"]}"' in pyproject
    assert '-p rlcore.testing.pytest_plugin' in pyproject
    # registration modules stay cheap to import: no torch at import time
    assert "import torch" not in (root / values["pkg"] / "__init__.py").read_text()


def test_cli_errors_are_one_line(tmp_path):
    res = _rlcore("new", "plugin", "reward", "Bad-Name", "--dir", str(tmp_path))
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "invalid plugin name 'Bad-Name'" in res.stderr
    res = _rlcore("new", "plugin", "widget", "ok_name", "--dir", str(tmp_path))
    assert res.returncode == 2 and "'widget' is not one of" in res.stderr


def test_generated_plugins_install_list_and_pass_their_tests(tmp_path):
    """One package per kind, really pip-installed; their own test suites run, unchanged, in a
    subprocess (one pytest process for all six keeps this fast; rlcore's pytest plugin limits
    ``RLCORE_PLUGINS`` to each package's own distribution for its tests)."""
    suffix = f"sc{os.getpid()}"
    names = {kind: f"{suffix}_{kind}" for kind in SCAFFOLD_KINDS}
    dists = {kind: template_values(kind, name)["dist"] for kind, name in names.items()}
    roots = {}
    for kind, name in names.items():
        if kind == "scheduler":  # one through the command line, the rest through the function
            res = _rlcore("new", "plugin", kind, name, "--dir", str(tmp_path), env={"RLCORE_PLUGINS": ""})
            assert res.returncode == 0, res.stderr
            roots[kind] = tmp_path / dists[kind]
            assert f"pip install -e {roots[kind]}" in res.stdout
        else:
            roots[kind] = new_plugin(kind, name, tmp_path)
    editable = [arg for root in roots.values() for arg in ("-e", str(root))]
    res = pip("install", "--no-deps", "--no-build-isolation", *editable)
    try:
        assert res.returncode == 0, res.stderr

        res = _rlcore("plugins", "--json", env={"RLCORE_PLUGINS": ",".join(dists.values())})
        assert res.returncode == 0, res.stderr
        listed = {p["distribution"]: p for p in json.loads(res.stdout)}
        for kind, name in names.items():
            record = listed[dists[kind]]
            assert record["error"] is None, record["error"]
            assert record["components"] == {kind: [name]}
            assert HOOK_OF_KIND[kind] in record["hooks"]

        env = {**os.environ, "RLCORE_PLUGINS": ",".join(dists.values())}
        # the generated packages' own tests, and (alongside, to share the wait) one real training
        # step that uses five of them together (the env one needs an env scheduler)
        out = tmp_path / "run"
        train = subprocess.Popen(
            [sys.executable, "-m", "rlcore.commands.cli", "train", "--scheduler", names["scheduler"], "--loss-type", names["loss"],
             "--advantage", names["advantage"], "--sampler", names["sampler"], "--reward", names["reward"],
             "--reward", "digits", "--max-steps", "1", "--num-generations", "2", "--per-device-train-batch-size", "4",
             "--max-completion-length", "8", "--output-dir", str(out), "--plots", "false"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            first = roots["reward"]
            run = subprocess.run(
                [sys.executable, "-m", "pytest", "-v", "-c", str(first / "pyproject.toml"), "--rootdir", str(tmp_path),
                 "--import-mode=importlib", *(str(root / "tests") for root in roots.values())],
                cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env,
            )
            train_out, train_err = train.communicate(timeout=600)
        finally:
            if train.poll() is None:
                train.kill()
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
        for kind, root in roots.items():  # every package's own tests ran and passed
            for module in ("test_registration", f"test_{kind}"):
                assert f"{root.name}/tests/{module}.py::" in run.stdout, f"{module} of the {kind} plugin did not run"
        assert "SKIPPED" not in run.stdout and "FAILED" not in run.stdout

        assert train.returncode == 0, train_out[-2000:] + train_err[-2000:]
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert metrics[-1]["step"] == 1
        assert f"rewards/{names['reward']}" in metrics[-1] and math.isfinite(metrics[-1]["loss"])
    finally:
        pip("uninstall", "-y", *dists.values())
