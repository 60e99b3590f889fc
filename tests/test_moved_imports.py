"""Every import path that existed before issue #30's restructuring keeps working.

A module that moved (:data:`rlcore.compat.moved.MOVED`) imports under its old name as the very same
module object as under its new one, with a :class:`DeprecationWarning` that names the new path; the
alias finder never answers for a name a real module has; ``python -m`` of an old command path
runs the command. The repository itself (code, tests, plugins, docs) names only the new paths.

The imports run in fresh interpreters (one for all of :data:`MOVED`): an import under test must not
find the module already imported by this test session.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlcore.compat.moved import MOVED, MOVED_NAMES

REPO = Path(__file__).resolve().parent.parent
CORE = REPO / "core"


def _python(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args, "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


_PROBE = r"""
import importlib, json, sys, warnings
import rlcore
from rlcore.compat.moved import MOVED
out = {}
for old, new in MOVED.items():
    already = old in sys.modules
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            module = importlib.import_module(old)
        except BaseException as exc:
            out[old] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
    parent, _, child = old.rpartition(".")
    out[old] = {
        "already_imported": already,
        "same_object": module is sys.modules.get(new),
        "name": module.__name__,
        "spec": getattr(module.__spec__, "name", None),
        "parent_attribute": getattr(sys.modules[parent], child, None) is module,
        "warnings": [[w.category.__name__, str(w.message)] for w in caught],
    }
print("\nPROBE " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def probed() -> dict[str, Any]:
    proc = _python(_PROBE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.rsplit("\nPROBE ", 1)[1])


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_is_the_new_module_with_a_warning(probed: dict[str, Any], old: str) -> None:
    new = MOVED[old]
    got = probed[old]
    assert "error" not in got, f"import {old}: {got.get('error')}"
    assert not got["already_imported"], f"{old} was imported by `import rlcore` itself: product code uses the old path"
    assert got["same_object"], f"import {old} gave another module object than import {new}"
    assert got["name"] == new and got["spec"] == new, f"{old}: the module is not named as it lives ({got})"
    assert got["parent_attribute"], f"{old}: the parent package's attribute is not the module"
    deprecations = [msg for cat, msg in got["warnings"] if cat == "DeprecationWarning"]
    assert any(old in msg and new in msg for msg in deprecations), \
        f"import {old}: no DeprecationWarning naming {new}; warnings: {got['warnings']}"


def test_old_names_warn_as_errors_under_W_error() -> None:
    """``-W error::DeprecationWarning`` (a strict CI) turns an old path into an ImportError-like failure."""
    proc = _python("import rlcore.train_cli", "-W", "error::DeprecationWarning")
    assert proc.returncode != 0
    assert "rlcore.train_cli moved to rlcore.commands.train" in proc.stderr


def test_from_imports_through_an_old_path_give_the_same_objects() -> None:
    code = r"""
import warnings
warnings.simplefilter("ignore", DeprecationWarning)
from rlcore.train_cli import build_plan as old_train
from rlcore.commands.train import build_plan as new_train
assert old_train is new_train
from rlcore.rollout.swift4 import SwiftHelpers as old_helpers
from rlcore.compat.swift.v4 import SwiftHelpers
assert old_helpers is SwiftHelpers
from rlcore.training.agents import RolloutFuncScheduler as old_agents
from rlcore.compat.trl.agents import RolloutFuncScheduler
assert old_agents is RolloutFuncScheduler
from rlcore.sampling.hf_static import StaticDecoder as old_static
from rlcore.sampling.hf.static import StaticDecoder
assert old_static is StaticDecoder
print("ok")
"""
    proc = _python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_the_public_names_of_the_package_root_and_rollout() -> None:
    """``from rlcore import MultiTurnScheduler`` and ``from rlcore.rollout import RolloutOutput,
    remove_response`` (ms-swift ports use them) give ms-swift's compatibility objects."""
    code = r"""
import warnings
warnings.simplefilter("ignore", DeprecationWarning)
from rlcore import MultiTurnScheduler
from rlcore.rollout import RolloutOutput, remove_response
import rlcore.compat.swift as swift
assert MultiTurnScheduler is swift.MultiTurnScheduler, (MultiTurnScheduler, swift.MultiTurnScheduler)
assert RolloutOutput is swift.RolloutOutput
assert remove_response is swift.remove_response
messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
assert remove_response(messages) == "a" and messages == [{"role": "user", "content": "q"}]
print("ok")
"""
    proc = _python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_the_sampler_packages_keep_their_module_era_names() -> None:
    """``rlcore.sampling.hf`` and ``rlcore.sampling.vllm`` are packages now (no alias: real modules
    win) and still give their sampler; the vLLM one imports no vLLM until a sampler is built, which
    without vLLM installed fails with the install line."""
    code = r"""
import sys, warnings
warnings.simplefilter("error", DeprecationWarning)
from rlcore.sampling.hf import HFSampler
from rlcore.sampling.hf.sampler import HFSampler as new_hf
assert HFSampler is new_hf
from rlcore.sampling.vllm import VLLMSampler
from rlcore.sampling.vllm.engine import VLLMSampler as new_vllm
assert VLLMSampler is new_vllm
assert "vllm" not in sys.modules, "importing the vLLM sampler imported vLLM"
try:
    import vllm  # noqa: F401
except ImportError:
    from rlcore.errors import MissingDependencyError
    try:
        VLLMSampler("no-such-model")
    except MissingDependencyError as exc:
        assert "pip install 'rlcore[vllm]'" in str(exc), exc
    else:
        raise AssertionError("VLLMSampler without vLLM did not say what to install")
print("ok")
"""
    proc = _python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


@pytest.mark.parametrize("module", ["rlcore.cli", "rlcore.commands.cli", "rlcore"])
def test_python_dash_m_runs_the_command(module: str) -> None:
    """``python -m rlcore.cli`` (the old path: runpy through the alias), ``python -m rlcore.commands.cli``
    and ``python -m rlcore``."""
    proc = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "version 0.1.0" in proc.stdout


def test_the_finder_never_shadows_a_real_module() -> None:
    """An entry for a name a real module answers to is dead (the finder is asked last) and would hide
    that it is dead: none exists. And the finder is asked last: an alias added for a real module
    gives the real module, with no warning."""
    real = {_module_name(p) for p in CORE.rglob("*.py")}
    assert not (set(MOVED) & real), f"MOVED names real modules (remove those entries): {sorted(set(MOVED) & real)}"
    code = r"""
import sys, warnings
import rlcore
from rlcore.compat import moved
assert isinstance(sys.meta_path[-1], moved.MovedModuleFinder), sys.meta_path
assert "rlcore.commands.scaffold" not in sys.modules
moved.MOVED["rlcore.commands.scaffold"] = "rlcore.errors"
warnings.simplefilter("error", DeprecationWarning)
import rlcore.commands.scaffold as scaffold
assert scaffold.__file__.endswith("scaffold.py") and scaffold is not sys.modules["rlcore.errors"]
print("ok")
"""
    proc = _python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_an_unknown_name_is_still_an_import_error() -> None:
    proc = _python("import rlcore.no_such_module")
    assert proc.returncode != 0 and "ModuleNotFoundError: No module named 'rlcore.no_such_module'" in proc.stderr


def _module_name(path: Path) -> str:
    parts = ["rlcore", *path.relative_to(CORE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# --- the repository names only the new paths -----------------------------------------------------------
#: files that name old paths on purpose: the alias table, this test, the layer checker's self-test
#: (a throwaway package whose module names are literals)
_NAMES_OLD_PATHS = {"core/compat/moved.py", "tests/test_moved_imports.py", "tests/test_layers.py"}
_OLD = re.compile(r"(?<![\w.])(" + "|".join(re.escape(o) for o in sorted(MOVED, key=len, reverse=True)) + r")(?!\w)")
#: a module's old file (``core/rollout/swift4.py``, ``rlcore/train_cli.py``) in prose
_OLD_FILES = {o.replace("rlcore.", "", 1).replace(".", "/") + ".py" for o in MOVED}
_FILE = re.compile(r"(?:core|rlcore)/([\w/]+\.py)")
#: names that left a module which stays (``rlcore.rollout.remove_response``: now ``rlcore.compat.swift``)
_OLD_NAMES = {f"{module}.{name}" for module, names in MOVED_NAMES.items() for name in names}
_OLD_NAME = re.compile(r"(?<![\w.])(" + "|".join(re.escape(n) for n in sorted(_OLD_NAMES, key=len, reverse=True))
                       + r")(?!\w)") if _OLD_NAMES else None
_FROM_IMPORT = re.compile(r"from (rlcore(?:\.\w+)*) import ([\w, ()]+)")


def _repo_files(*patterns: str) -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", *patterns], capture_output=True, text=True, cwd=REPO, check=True)
    return [REPO / line for line in tracked.stdout.splitlines() if line not in _NAMES_OLD_PATHS and (REPO / line).is_file()]


_RELATIVE = re.compile(r"\.+\w+(\.\w+)*")


def _package_of(path: Path) -> str | None:
    """The package a core module's relative names resolve in (None outside ``core/``)."""
    if CORE not in path.parents:
        return None
    module = _module_name(path)
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _resolve(relative: str, package: str) -> str:
    level = len(relative) - len(relative.lstrip("."))
    base = package.split(".")
    return ".".join(base[: len(base) - (level - 1)] + [relative.lstrip(".")])


def test_no_python_file_imports_an_old_path() -> None:
    """Imports (of modules, and of names that left a module: ``from rlcore.rollout import
    remove_response``), ``importlib``/registration strings (``"rlcore.x:attr"``, a core package's
    lazy ``".x"``): the core, its tests, the plugin packages, examples and benches use where a
    module lives now."""
    bad = []
    for path in _repo_files("*.py"):
        package = _package_of(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [m.group(1) for m in _OLD.finditer(node.value)]
                if package and _RELATIVE.fullmatch(node.value):  # importlib.import_module(".x", __name__)
                    names.append(_resolve(node.value, package))
            bad += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n in MOVED or n in _OLD_NAMES]
    assert not bad, "old module paths (use the new one, rlcore.compat.moved.MOVED):\n" + "\n".join(sorted(set(bad)))


def test_the_docs_name_only_new_paths() -> None:
    bad = []
    for path in _repo_files("*.md"):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            bad += [f"{path.relative_to(REPO)}:{i}: {m.group(1)}" for m in _OLD.finditer(line)]
            bad += [f"{path.relative_to(REPO)}:{i}: {m.group(0)}" for m in _FILE.finditer(line)
                    if m.group(1) in _OLD_FILES or not (CORE / m.group(1)).is_file()]
            if _OLD_NAME is not None:
                bad += [f"{path.relative_to(REPO)}:{i}: {m.group(1)}" for m in _OLD_NAME.finditer(line)]
            for m in _FROM_IMPORT.finditer(line):
                moved_here = MOVED_NAMES.get(m.group(1), {})
                bad += [f"{path.relative_to(REPO)}:{i}: from {m.group(1)} import {n}"
                        for n in re.findall(r"\w+", m.group(2)) if n in moved_here]
    assert not bad, "docs name old module paths, moved names or core files that do not exist:\n" + "\n".join(bad)


def test_every_public_name_of_a_core_package_imports_without_a_deprecation() -> None:
    """``__all__`` of each package (lazy ``__getattr__`` exports included: ``rlcore.loop.Rewards``)
    resolves where the code lives now, never through an old path."""
    packages = sorted(_module_name(p) for p in CORE.rglob("__init__.py")
                      if "testing" not in p.relative_to(CORE).parts)
    code = r"""
import importlib, sys, warnings
warnings.simplefilter("error", DeprecationWarning)
bad = []
for name in sys.argv[1:]:
    try:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            getattr(module, attr)
    except DeprecationWarning as exc:
        bad.append(f"{name}.{attr}: {exc}")
    except ImportError as exc:  # an optional dependency (vLLM, Ray) this machine lacks
        if "rlcore" in str(exc):
            bad.append(f"{name}: {exc}")
print("\n".join(bad) or "ok")
"""
    proc = subprocess.run([sys.executable, "-c", code, *packages], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout[-3000:] + proc.stderr[-3000:]
