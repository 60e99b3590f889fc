"""Write, pip-install and uninstall throwaway plugin packages in tests (real installs, no mocks)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator


def write_plugin_package(root: Path, dist: str, module: str, source: str, entry_point: str | None = None,
                         components: tuple[str, ...] = ()) -> Path:
    """Create ``root/dist`` holding a one-module plugin package with an ``rlcore`` entry point
    (and the ``components`` it declares in the ``rlcore.components`` group)."""
    declared = "".join(f'{name} = "{module}"\n' for name in components)
    pkg = Path(root) / dist
    (pkg / module).mkdir(parents=True, exist_ok=True)
    (pkg / module / "__init__.py").write_text(textwrap.dedent(source))
    (pkg / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{dist}"
            version = "0.0.1"
            dependencies = ["rlcore"]

            [project.entry-points.rlcore]
            {entry_point or module} = "{module}"

            [project.entry-points."rlcore.components"]
            """
        )
        + declared
        + textwrap.dedent(
            f"""
            [tool.setuptools]
            packages = ["{module}"]
            """
        )
    )
    return pkg


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
        capture_output=True, text=True, check=False,
    )


@contextlib.contextmanager
def installed(path: Path, dist: str, editable: bool = False) -> Iterator[None]:
    """pip-install the package at ``path`` for the duration of the block, then uninstall it."""
    args = ["install", "--no-deps", "--no-build-isolation"]
    args += ["-e", str(path)] if editable else [str(path)]
    res = pip(*args)
    if res.returncode != 0:
        raise RuntimeError(f"pip install {path} failed: {res.stderr.strip().splitlines()[-1:]}")
    import importlib

    importlib.invalidate_caches()
    try:
        yield
    finally:
        pip("uninstall", "-y", dist)
        importlib.invalidate_caches()


def write_site_plugin(site: Path, dist: str, module: str, source: str) -> Path:
    """Install a one-module plugin into the directory ``site`` without pip: the module and a
    ``DIST-0.0.1.dist-info`` with its ``rlcore`` entry point, as an installer would leave them.
    Put ``site`` on ``sys.path`` (or ``PYTHONPATH`` for a subprocess) and name ``dist`` in
    ``RLCORE_PLUGINS`` to load it; returns ``site``."""
    site = Path(site)
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-0.0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[rlcore]\n{module} = {module}\n")
    (info / "top_level.txt").write_text(f"{module}\n")
    return site


def load_in_process(monkeypatch: Any, name: str, **hooks: Any) -> Any:
    """Make a module named ``name`` holding ``hooks`` (hook name -> function, e.g.
    ``register_rewards=lambda register: register("x", fn)``) one of rlcore's built-in plugins for
    one test (``monkeypatch`` undoes it): the fastest way to give a test a component of its own.
    An installed package is :func:`write_site_plugin` / :func:`installed`."""
    import types

    import rlcore
    import rlcore.plugins as registry

    module = types.ModuleType(name)
    for hook, fn in hooks.items():
        setattr(module, hook, rlcore.hookimpl(fn))
    monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(registry, "_plugins", registry.Plugins(allow=[], builtins=[*registry.BUILTIN_PLUGINS, name]))
    return module
