"""The "which package provides NAME" hint comes from package metadata, not from a list in the core.

A plugin distribution declares the component names it registers in the ``rlcore.components``
entry-point group; rlcore reads that metadata (importing nothing) to name the package when a run
asks for one of them while the package is installed but left out of ``RLCORE_PLUGINS``, or broken.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

import rlcore
from rlcore.errors import UnknownComponentError
from rlcore.plugins import COMPONENTS_GROUP, Plugins
from rlcore.testing.packages import installed, write_plugin_package

REPO = Path(__file__).resolve().parent.parent
PYPROJECTS = sorted((REPO / "plugins").glob("*/*/pyproject.toml"))

PLUGIN = '''
import rlcore


@rlcore.hookimpl
def register_rewards(register):
    register("metadata_probe_reward", lambda **kw: [1.0], aliases=["metadata_probe_alias"])
'''


def _registered_by(dist: str) -> set[str]:
    """Names and aliases ``dist`` registers when it is the only distribution loaded."""
    p = Plugins(allow=[dist])
    rec = next(r for r in p.list() if not r.builtin)
    assert rec.error is None, rec.error
    names = {n for comps in rec.components.values() for n in comps}
    aliases = {a for kind, table in p._aliases.items() for a, target in table.items()
               if p.registry[kind][target].dist == rec.dist}
    return names | aliases


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=[p.parent.name for p in PYPROJECTS])
def test_in_repo_plugins_declare_exactly_what_they_register(pyproject: Path) -> None:
    meta = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    declared = set(meta.get("entry-points", {}).get(COMPONENTS_GROUP, {}))
    assert declared, f"{pyproject.relative_to(REPO)} declares no [project.entry-points.\"{COMPONENTS_GROUP}\"]"
    assert declared == _registered_by(meta["name"]), f"{meta['name']}: declared vs registered differ"


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a module's code (docstrings, which may cite a package as an example, aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_the_core_names_no_plugin_package() -> None:
    """The core carries no table of our plugin packages or their components: no core module's code
    names one (test support in ``rlcore.testing`` aside)."""
    names: set[str] = set()
    for p in PYPROJECTS:
        meta = tomllib.loads(p.read_text(encoding="utf-8"))["project"]
        names |= {meta["name"], *meta["entry-points"]["rlcore"].values()}
    found = [f"{path.relative_to(REPO)}:{line}: {text!r}" for path in sorted((REPO / "core").rglob("*.py"))
             if "testing" not in path.relative_to(REPO).parts
             for line, text in _code_strings(path) if any(n in text for n in names)]
    assert not found, "core code naming plugin packages:\n" + "\n".join(found)


def test_an_installed_unloaded_package_is_named_from_its_metadata(tmp_path: Path) -> None:
    dist = "rlcore-metadata-probe"
    pkg = write_plugin_package(tmp_path, dist, "rlcore_metadata_probe", PLUGIN,
                               components=("metadata_probe_reward", "metadata_probe_alias"))
    with installed(pkg, dist):
        rlcore.reload_plugins()  # RLCORE_PLUGINS="" (conftest): built-ins only
        with pytest.raises(UnknownComponentError) as err:
            rlcore.get("reward", "metadata_probe_alias")
        msg = str(err.value)
        assert msg.startswith("no reward named 'metadata_probe_alias'; available: ")
        assert msg.endswith(f"({dist} is installed but not in RLCORE_PLUGINS)") and "\n" not in msg
        # loaded, the same names resolve
        p = Plugins(allow=[dist])
        assert p.get("reward", "metadata_probe_alias")() == [1.0]
    rlcore.reload_plugins()
    with pytest.raises(UnknownComponentError) as err:  # uninstalled: no metadata, no package named
        rlcore.get("reward", "metadata_probe_alias")
    assert dist not in str(err.value)


def test_a_broken_package_is_named_with_its_error(tmp_path: Path) -> None:
    dist = "rlcore-metadata-broken"
    pkg = write_plugin_package(tmp_path, dist, "rlcore_metadata_broken", "raise ImportError('needs libbar')\n",
                               components=("broken_probe_reward",))
    with installed(pkg, dist):
        p = Plugins(allow=[dist])
        with pytest.raises(UnknownComponentError) as err:
            p.get("reward", "broken_probe_reward")
    assert str(err.value) == f"reward 'broken_probe_reward' comes from {dist}, which failed to load: ImportError: needs libbar"
