"""The wheels carry the source tree: every module and every data file, nothing left behind.

A regular (non-editable) install once lacked ``rlcore.loop`` because pyproject.toml listed the
packages by hand; an editable install maps ``rlcore`` to ``core/`` and cannot see that. So this
builds the real wheels (``pip wheel --no-deps --no-build-isolation``, offline, a few seconds) from a
copy of the files a fresh clone holds, and compares each wheel's file list with the source tree:
``core/X`` must be ``rlcore/X`` in the rlcore wheel, each plugin package's files must be in its
wheel, and nothing else may be (a stale ``build/`` folder leaks deleted modules into wheels built
in place). The non-editable install itself is exercised by ``.ci/wheel_smoke``.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLUGIN_ROOTS = sorted(p.parent.relative_to(REPO) for p in (REPO / "plugins").glob("*/*/pyproject.toml"))
#: what the rlcore distribution is built from, besides core/ itself
DIST_FILES = ("pyproject.toml", "setup.py", "README.md")


def source_files(path: Path | str) -> list[str]:
    """The files under ``path`` (relative to the repository) that a commit of this tree holds:
    tracked plus untracked-but-not-ignored (so a new module counts before ``git add``)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", str(path)],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return sorted(f for f in out if (REPO / f).is_file())  # a deleted file stays "cached" until committed


def _copy(files: list[str], dest: Path) -> None:
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)


def _plugin_package(root: Path) -> str:
    """The import package a plugin distribution ships: the module its ``rlcore`` entry point names."""
    meta = tomllib.loads((REPO / root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (target,) = set(meta["entry-points"]["rlcore"].values())
    return target.split(":")[0].split(".")[0]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, zipfile.ZipFile]:
    """Every wheel of the repository, built in one pip run from a clean copy: {distribution root: wheel}."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.fail("tests/test_packaging.py compares wheels with the git checkout; run it from one (git on PATH)")
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheels")
    _copy([f for f in DIST_FILES if (REPO / f).exists()] + source_files("core"), src)
    for root in PLUGIN_ROOTS:
        _copy([f for f in source_files(root) if not f.startswith(f"{root}/tests/")], src)
    roots = [".", *map(str, PLUGIN_ROOTS)]
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "--quiet", "-w", str(out), *roots], cwd=src, capture_output=True, text=True)
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    built = {}
    for root in roots:
        name = "rlcore" if root == "." else tomllib.loads((src / root / "pyproject.toml").read_text())["project"]["name"]
        (whl,) = out.glob(name.replace("-", "_") + "-*.whl")
        built[root] = zipfile.ZipFile(whl)
    return built


def _payload(whl: zipfile.ZipFile) -> set[str]:
    """The wheel's files, its metadata folder aside."""
    return {n for n in whl.namelist() if not n.split("/", 1)[0].endswith(".dist-info")}


def _entry_points(whl: zipfile.ZipFile) -> configparser.ConfigParser:
    (name,) = [n for n in whl.namelist() if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(whl.read(name).decode())
    return parser


def _module_file(module: str, payload: set[str]) -> bool:
    path = module.split(":")[0].strip().replace(".", "/")
    return f"{path}.py" in payload or f"{path}/__init__.py" in payload


def test_rlcore_wheel_holds_every_file_under_core(wheels: dict[str, zipfile.ZipFile]) -> None:
    expected = {"rlcore/" + f.removeprefix("core/") for f in source_files("core")}
    assert any(f.endswith(".py") for f in expected) and any(not f.endswith(".py") for f in expected)
    payload = _payload(wheels["."])
    missing, extra = sorted(expected - payload), sorted(payload - expected)
    assert not missing, ("the rlcore wheel lacks files of core/ (a package or data file the build does not pick "
                         "up: see setup.py and [tool.setuptools.package-data] in pyproject.toml):\n" + "\n".join(missing))
    assert not extra, "the rlcore wheel holds files that are not in core/:\n" + "\n".join(extra)


def test_rlcore_wheel_entry_points_name_modules_it_holds(wheels: dict[str, zipfile.ZipFile]) -> None:
    eps, payload = _entry_points(wheels["."]), _payload(wheels["."])
    assert eps["console_scripts"]["rlcore"] == "rlcore.commands.cli:main"
    assert "rlcore.testing.pytest_plugin" in eps["pytest11"]  # plugin packages' own tests use it after a plain install
    for group in eps.sections():
        for name, target in eps[group].items():
            assert _module_file(target, payload), f"rlcore wheel: entry point {group}:{name} = {target} names a missing module"


@pytest.mark.parametrize("root", PLUGIN_ROOTS, ids=[r.name for r in PLUGIN_ROOTS])
def test_plugin_wheel_holds_its_package(root: Path, wheels: dict[str, zipfile.ZipFile]) -> None:
    whl, package = wheels[str(root)], _plugin_package(root)
    expected = {f.removeprefix(f"{root}/") for f in source_files(root / package)}
    assert f"{package}/__init__.py" in expected
    payload = _payload(whl)
    missing, extra = sorted(expected - payload), sorted(payload - expected)
    assert not missing, f"the {root.name} wheel lacks files of {root}/{package}:\n" + "\n".join(missing)
    assert not extra, f"the {root.name} wheel holds files outside {root}/{package} (tests? another package?):\n" + "\n".join(extra)
    eps = _entry_points(whl)
    assert eps["rlcore"], f"{root.name}: no entry point in the rlcore group"
    for group in eps.sections():
        for name, target in eps[group].items():
            assert _module_file(target, payload), f"{root.name} wheel: entry point {group}:{name} = {target} names a missing module"


# --- code that reads files beside itself, run from the wheel ---------------------------------------
@pytest.fixture(scope="module")
def site(wheels: dict[str, zipfile.ZipFile], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rlcore wheel unpacked as an install would lay it out (a site-packages folder)."""
    root = tmp_path_factory.mktemp("site")
    wheels["."].extractall(root)
    return root


def _from_wheel(site: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run python with the unpacked wheel first on sys.path (ahead of the editable checkout)."""
    return subprocess.run([sys.executable, *args], cwd=cwd, env={**os.environ, "PYTHONPATH": str(site)},
                          capture_output=True, text=True, timeout=300)


def test_docgen_from_an_installed_rlcore_reads_the_checkout_it_runs_in(site: Path) -> None:
    """Installed, rlcore/commands/docgen.py sits in site-packages: the docs and plugins it documents are the
    checkout's (found from the current directory), never folders beside site-packages."""
    code = "import json, rlcore, rlcore.commands.docgen as d; print(json.dumps([rlcore.__file__, d.repository_plugins()]))"
    proc = _from_wheel(site, ["-c", code], REPO)
    assert proc.returncode == 0, proc.stderr
    where, plugins = json.loads(proc.stdout)
    assert Path(where).is_relative_to(site), f"rlcore came from {where}, not the unpacked wheel"
    names = sorted(tomllib.loads((REPO / r / "pyproject.toml").read_text())["project"]["name"] for r in PLUGIN_ROOTS)
    assert plugins == names, "docgen read the plugin packages from beside the installed rlcore, not from the checkout"


def test_docgen_outside_a_checkout_says_so_in_one_line(site: Path, tmp_path: Path) -> None:
    proc = _from_wheel(site, ["-m", "rlcore.commands.docgen", "--check"], tmp_path)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "not inside" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
