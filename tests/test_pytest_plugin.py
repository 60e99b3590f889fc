"""rlcore's pytest plugin, run the way a third-party plugin package runs it: pytest in the package's
own directory, the plugin named by ``-p`` (as the scaffold's pyproject does), no conftest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from rlcore.testing.pytest_plugin import default_plugins

PYPROJECT = '''
[project]
name = "rl-plugin-probe"
version = "0.0.1"

[project.entry-points.rlcore]
probe = "rl_plugin_probe"

[tool.pytest.ini_options]
addopts = "-p no:cacheprovider -p rlcore.testing.pytest_plugin"
'''

TESTS = '''
import os


def test_only_this_distribution_loads(rlcore_plugins):
    assert rlcore_plugins == "rl-plugin-probe" == os.environ["RLCORE_PLUGINS"]


def test_the_tiny_tokenizer_has_a_chat_template(tiny_tokenizer):
    assert tiny_tokenizer.chat_template


def test_reads_shared_data(shared_data):
    assert (shared_data / "marker.txt").read_text() == "here"
'''


def _pytest(project: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("RLCORE_SHARED_DATA", "RLCORE_REQUIRE"))}
    return subprocess.run([sys.executable, "-m", "pytest", "-rs", "-q"], cwd=project, capture_output=True, text=True,
                          env={**full, **env}, timeout=300)


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "rl-plugin-probe"
    (project / "tests").mkdir(parents=True)
    (project / "pyproject.toml").write_text(PYPROJECT)
    (project / "tests" / "test_probe.py").write_text(textwrap.dedent(TESTS))
    return project


def test_a_plugin_package_runs_from_its_directory_with_the_fixtures(tmp_path: Path) -> None:
    project = _project(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    (data / "marker.txt").write_text("here")
    res = _pytest(project, RLCORE_SHARED_DATA=str(data))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "3 passed" in res.stdout


def test_missing_shared_data_skips_with_the_path_and_fails_when_required(tmp_path: Path) -> None:
    project = _project(tmp_path)
    missing = tmp_path / "nowhere"
    res = _pytest(project, RLCORE_SHARED_DATA=str(missing))
    assert res.returncode == 0 and "2 passed, 1 skipped" in res.stdout, res.stdout[-3000:]
    assert f"the shared data folder {missing} is absent" in res.stdout
    res = _pytest(project, RLCORE_SHARED_DATA=str(missing), RLCORE_REQUIRE_SHARED_DATA="1")
    assert res.returncode == 1 and "2 passed, 1 error" in res.stdout, res.stdout[-3000:]  # fails at setup
    assert "RLCORE_REQUIRE_SHARED_DATA is set, so this is an error, not a skip" in res.stdout


def test_which_plugins_a_test_loads(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parent.parent
    assert default_plugins(repo / "tests" / "test_x.py") == ""  # rlcore's own tests: built-ins only
    assert default_plugins(repo / "plugins" / "envs" / "rl-plugin-gym" / "tests" / "test_x.py") == "rl-plugin-gym"
    app = tmp_path / "app"
    (app / "tests").mkdir(parents=True)
    (app / "pyproject.toml").write_text('[project]\nname = "my-training-app"\n')
    assert default_plugins(app / "tests" / "test_x.py") is None  # an application using rlcore: left alone


def test_another_projects_run_is_left_as_it_is(tmp_path: Path) -> None:
    """Installing rlcore must not change another project's test run: its gpu-marked tests run, the
    Hugging Face offline variables stay unset, RLCORE_PLUGINS is not touched."""
    project = tmp_path / "someapp"
    (project / "tests").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "someapp"\nversion = "0"\n\n[tool.pytest.ini_options]\n'
                                           'addopts = "-p no:cacheprovider -p rlcore.testing.pytest_plugin"\n'
                                           'markers = ["gpu: theirs"]\n')
    (project / "tests" / "test_app.py").write_text(textwrap.dedent('''
        import os

        import pytest


        @pytest.mark.gpu
        def test_their_gpu_marker_is_theirs():
            assert True


        def test_environment_untouched():
            assert "HF_HUB_OFFLINE" not in os.environ and "RLCORE_PLUGINS" not in os.environ
    '''))
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "RLCORE_PLUGINS", "TRANSFORMERS_OFFLINE")}
    out = subprocess.run([sys.executable, "-m", "pytest", "-rs", "-q"], cwd=project, capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 passed" in out.stdout and "skipped" not in out.stdout, out.stdout
