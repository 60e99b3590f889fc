"""The layer order of ``docs/concepts.md`` ("Layers"), checked against every module's imports.

Each module of ``rlcore`` belongs to one layer; a module may import modules of its own layer and of
lower ones, never of a higher one. Imports inside functions count too: a lazy import hides a cycle
from Python, not from the reader. Importing ``rlcore.a.b`` also runs ``rlcore/a/__init__.py``, so the
packages above a module count as imported as well. The in-repo plugin packages sit above the whole
core and may not import each other's modules in a circle.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CORE = REPO / "core"

#: lowest first; a module's layer is the one of its longest matching prefix (docs/concepts.md "Layers").
#: Below the foundation's single modules, every layer is a folder of ``core/``.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("rlcore.errors", "rlcore.types", "rlcore.asyncutil", "rlcore.bounded", "rlcore.hookspecs",
                    "rlcore.envs", "rlcore.chat_template", "rlcore.protocols", "rlcore.gguf",
                    "rlcore.compat")),  # compat/__init__ (a docstring) and compat.moved import nothing of rlcore
    ("registry", ("rlcore.plugins", "rlcore.builtin_components")),
    ("sampling", ("rlcore.sampling",)),
    ("rollout", ("rlcore.rollout",)),
    ("components", ("rlcore.rewards", "rlcore.algorithms", "rlcore.data")),
    ("training", ("rlcore.training",)),
    ("loop", ("rlcore.loop",)),
    ("trainer", ("rlcore.trainer",)),  # GRPOTrainer, built on the loop API's calls
    ("facade", ("rlcore",)),  # the package root: the public names, GRPOTrainer lazily
    ("distributed", ("rlcore.distributed",)),
    ("compat", ("rlcore.compat.swift", "rlcore.compat.trl")),  # other frameworks' vocabulary
    ("commands", ("rlcore.commands", "rlcore.__main__")),  # python -m rlcore
    ("testing", ("rlcore.testing",)),  # test support: imports anything, imported by no product module
]
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}

#: the one import that runs up a layer on purpose: ``from rlcore import MultiTurnScheduler`` is the
#: documented ms-swift port (an ms-swift scheduler runs with its imports changed), and what it must
#: give is the ms-swift base class, which lives in compat/swift
ALLOWED_UPWARD = {("rlcore", "rlcore.compat.swift")}


def layer_of(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for name, prefixes in LAYERS:
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[0]):
                best = (len(p), name)
    return best[1] if best else None


def module_name(path: Path, root: Path, package: str) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_modules() -> dict[str, Path]:
    return {module_name(p, CORE, "rlcore"): p for p in sorted(CORE.rglob("*.py"))}


def imports_of(path: Path, module: str, known: set[str]) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for every import of a module in ``known`` (any depth, lazy ones included)."""
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            # ``from pkg import sub`` imports the submodule pkg.sub when there is one
            targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in known else src for a in node.names]
        for t in targets:
            # importing a.b.c runs a.b/__init__ too (the root package is exempt: everything is under it)
            parts = t.split(".")
            for i in range(2, len(parts) + 1):
                name = ".".join(parts[:i])
                if name in known:
                    yield node.lineno, name
            if t == "rlcore" and "rlcore" in known:
                yield node.lineno, t


def upward_imports() -> list[str]:
    mods = core_modules()
    known = set(mods)
    bad = []
    for module, path in mods.items():
        mine = layer_of(module)
        for line, target in imports_of(path, module, known):
            theirs = layer_of(target)
            if target == module or module.startswith(target + ".") or mine is None or theirs is None:
                continue  # a module's own package __init__ runs before it anyway
            if RANK[theirs] > RANK[mine] and (module, target) not in ALLOWED_UPWARD:
                rel = path.relative_to(REPO)
                bad.append(f"{rel}:{line}: {module} ({mine}) imports {target} ({theirs}), a higher layer")
    return bad


def test_every_module_has_a_layer() -> None:
    missing = [m for m in core_modules() if layer_of(m) is None]
    assert not missing, f"modules with no layer (add them to LAYERS here and to docs/concepts.md): {missing}"


def test_no_module_imports_a_higher_layer() -> None:
    bad = upward_imports()
    assert not bad, "imports against the layer order (docs/concepts.md, Layers):\n" + "\n".join(bad)


def test_the_checker_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The check itself: a function-level relative import of a higher layer is reported."""
    pkg = tmp_path / "rlcore"
    (pkg / "rollout").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "rollout" / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("def f():\n    from .rollout import tokens\n")
    (pkg / "rollout" / "tokens.py").write_text("")
    mods = {module_name(p, pkg, "rlcore"): p for p in pkg.rglob("*.py")}
    found = list(imports_of(pkg / "errors.py", "rlcore.errors", set(mods)))
    assert found == [(2, "rlcore.rollout"), (2, "rlcore.rollout.tokens")]
    assert RANK[layer_of("rlcore.rollout.tokens")] > RANK[layer_of("rlcore.errors")]


def test_the_layers_are_the_documented_ones() -> None:
    text = (REPO / "docs" / "concepts.md").read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    order = [name for name, _ in LAYERS]
    positions = [section.find(f"**{name}**") for name in order]
    assert all(p >= 0 for p in positions), f"docs/concepts.md 'Layers' must name every layer in bold: {order}"
    assert positions == sorted(positions), f"docs/concepts.md lists the layers in another order than {order}"


#: sampler backends share the sampling layer's common modules (base, weights, batcher, stops,
#: processing, vllm_support) and never import each other: the HTTP client must not need the vLLM
#: engine's modules, the decode loops must not reach into the sampler that owns them
BACKENDS = {
    "hf": ("rlcore.sampling.hf.sampler", "rlcore.sampling.hf.decode", "rlcore.sampling.hf.static"),
    "vllm": ("rlcore.sampling.vllm.engine", "rlcore.sampling.vllm.worker"),
    "openai": ("rlcore.sampling.openai",),
}


def test_sampler_backends_import_no_other_backend() -> None:
    mods = core_modules()
    owner = {m: b for b, ms in BACKENDS.items() for m in ms}
    assert set(owner) <= set(mods), f"BACKENDS names modules that do not exist: {set(owner) - set(mods)}"
    bad = [f"{mods[m].relative_to(REPO)}:{line}: {m} ({owner[m]}) imports {t} ({owner[t]})"
           for m in owner for line, t in imports_of(mods[m], m, set(mods)) if owner.get(t, owner[m]) != owner[m]]
    assert not bad, "a sampler backend imports another backend's module:\n" + "\n".join(bad)


def test_no_module_imports_another_packages_private_name() -> None:
    """``from rlcore.x import _name`` across packages: what another package needs is public."""
    mods = core_modules()
    bad = []
    for module, path in mods.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")
                src = ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            if not src.startswith("rlcore"):
                continue
            src_package = src if src in mods and mods[src].name == "__init__.py" else src.rpartition(".")[0]
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__") and src_package != package:
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {module} imports {src}.{a.name}")
    assert not bad, "private names imported across packages (make them public where they live):\n" + "\n".join(bad)


# --- plugin packages: no import cycles between their modules ------------------------------------------
def _plugin_packages() -> list[tuple[str, Path]]:
    out = []
    for pyproject in sorted((REPO / "plugins").glob("*/*/pyproject.toml")):
        for init in sorted(pyproject.parent.glob("*/__init__.py")):
            if init.parent.name != "tests":
                out.append((init.parent.name, init.parent))
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


@pytest.mark.parametrize("package,root", _plugin_packages(), ids=[p for p, _ in _plugin_packages()])
def test_plugin_package_modules_form_no_cycle(package: str, root: Path) -> None:
    """Module-to-module imports inside a plugin package (its ``__init__`` re-exports aside) go one way."""
    mods = {module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}
    graph = {m: {t for _, t in imports_of(p, m, set(mods)) if t != package and t != m} for m, p in mods.items()}
    cycle = _cycle(graph)
    assert cycle is None, f"{package}: import cycle {' -> '.join(cycle or [])}"


def test_core_modules_form_no_cycle() -> None:
    """Core modules import each other one way (package ``__init__`` re-exports aside)."""
    mods = core_modules()
    packages = {m for m, p in mods.items() if p.name == "__init__.py"}
    graph = {m: {t for _, t in imports_of(p, m, set(mods)) if t not in packages and t != m}
             for m, p in mods.items() if m not in packages}
    cycle = _cycle(graph)
    assert cycle is None, f"import cycle {' -> '.join(cycle or [])}"


# --- folders are the layers (issue #30) ------------------------------------------------------------------
def test_no_two_core_modules_share_a_basename() -> None:
    """One file name, one module: ``cli.py`` three times was three things to tell apart in a traceback,
    an editor tab, a ``git grep``. ``__init__.py`` is every package's. ``testing/`` is not exempt: it
    ships in the wheel, plugin packages' tests import it by name, and its tracebacks read like any
    other module's (``testing/cli.py`` beside ``commands/cli.py`` was one of the repeats)."""
    seen: dict[str, list[str]] = {}
    for path in sorted(CORE.rglob("*.py")):
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(path.relative_to(REPO).as_posix())
    repeated = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not repeated, f"basenames used by more than one module under core/: {repeated}"


#: below ``commands``, the core reaches ``compat/`` only through these: the built-in registration's
#: factory strings (``"rlcore.compat.…:attr"``, imported when the component is built) and the package
#: root's install of the alias finder (``compat.moved``, which imports nothing of rlcore)
COMPAT_REGISTRATION = {
    "rlcore.builtin_components": "factory strings",
    "rlcore": "compat.moved",
}
#: a string that names a compat module (``"rlcore.compat.swift.api"``, ``"..compat.trl:agents"``)
_COMPAT_STRING = re.compile(r"(?:rlcore\.|\.+)compat(?:\.\w+)*(?::[\w.]+)?")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                ids.add(id(first.value))
    return ids


def compat_uses_below_commands() -> list[str]:
    """Every import of ``rlcore.compat`` and every string naming a compat module (``importlib``, a
    factory) in a module below ``commands`` that is not in ``compat/`` itself, the registration aside."""
    mods = core_modules()
    known = set(mods)
    bad = []
    for module, path in mods.items():
        layer = layer_of(module)
        if module == "rlcore.compat" or module.startswith("rlcore.compat.") or layer is None:
            continue
        if RANK[layer] >= RANK["commands"]:
            continue
        rel = path.relative_to(REPO)
        for line, target in imports_of(path, module, known):
            if target == "rlcore.compat" or target.startswith("rlcore.compat."):
                if not (module == "rlcore" and target in ("rlcore.compat", "rlcore.compat.moved")) \
                        and (module, target) not in ALLOWED_UPWARD:
                    bad.append(f"{rel}:{line}: {module} imports {target}")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                    and _COMPAT_STRING.fullmatch(node.value):
                registration = module == "rlcore.builtin_components" and node.value.startswith("rlcore.compat.") \
                    and ":" in node.value
                if not registration:
                    bad.append(f"{rel}:{node.lineno}: {module} names {node.value!r}")
    return list(dict.fromkeys(bad))  # ``from x import (a, b)`` reports its line once


def test_nothing_below_commands_imports_compat_except_registration() -> None:
    """ms-swift's and TRL's vocabulary is fenced into ``compat/``: the driver, the schedulers, the
    trainer know rlcore's own contract, and an ms-swift or TRL component enters by registration."""
    bad = compat_uses_below_commands()
    assert not bad, "compat/ reached from below commands/ other than by registration:\n" + "\n".join(bad)


def test_the_compat_check_sees_strings_and_lazy_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: an ``importlib`` string and a function-level import are reported; the package
    root's ``compat.moved`` and a registration factory string are not."""
    pkg = tmp_path / "core"
    for d in ("rollout", "compat", "compat/swift"):
        (pkg / d).mkdir(parents=True, exist_ok=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .compat import moved\n")
    (pkg / "compat" / "moved.py").write_text("")
    (pkg / "compat" / "swift" / "api.py").write_text("")
    (pkg / "builtin_components.py").write_text('F = "rlcore.compat.swift.api:X"\n')
    (pkg / "rollout" / "driver.py").write_text(
        '"""Docs may say rlcore.compat.swift."""\nimport importlib\n'
        'def f():\n    from ..compat.swift import api\n    return importlib.import_module("rlcore.compat.swift.api")\n')
    monkeypatch.setattr(sys.modules[__name__], "CORE", pkg)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert compat_uses_below_commands() == [
        "core/rollout/driver.py:4: rlcore.rollout.driver imports rlcore.compat",
        "core/rollout/driver.py:4: rlcore.rollout.driver imports rlcore.compat.swift",
        "core/rollout/driver.py:4: rlcore.rollout.driver imports rlcore.compat.swift.api",
        "core/rollout/driver.py:5: rlcore.rollout.driver names 'rlcore.compat.swift.api'",
    ]


#: modules that sit in another layer than their folder: the alias finder (and its package's
#: ``__init__``, a docstring), which ``import rlcore`` installs and which import nothing of rlcore
FOLDER_EXCEPTIONS = ("rlcore.compat", "rlcore.compat.moved")


def test_every_folder_of_core_is_one_layer() -> None:
    """A newcomer reads the layers off the folder names: each top-level package of ``core/`` is in
    exactly one layer (every module under it, :data:`FOLDER_EXCEPTIONS` aside), and every name in
    ``LAYERS`` is a module that exists."""
    mods = core_modules()
    layers_of: dict[str, set[str]] = {}
    for module in mods:
        parts = module.split(".")
        if len(parts) < 2 or module in FOLDER_EXCEPTIONS:
            continue
        top = ".".join(parts[:2])
        if mods.get(top, Path()).name == "__init__.py":
            layers_of.setdefault(top, set()).add(str(layer_of(module)))
    spread = {top: sorted(layers) for top, layers in layers_of.items() if len(layers) > 1}
    assert not spread, f"folders of core/ whose modules sit in more than one layer: {spread}"
    stale = [p for _, prefixes in LAYERS for p in prefixes if p not in mods]
    assert not stale, f"LAYERS names modules that do not exist: {stale}"
    for module in FOLDER_EXCEPTIONS:
        assert not list(imports_of(mods[module], module, set(mods))), f"{module} imports rlcore modules"


# --- the README's size of the kernel ------------------------------------------------------------------
#: the kernel as the README names it: hooks, registry, types, the rollout driver, the scheduler base,
#: the algorithms
KERNEL = ("hookspecs.py", "plugins.py", "types.py", "rollout/driver.py", "rollout/scheduler.py", "algorithms")


def _lines(paths: list[Path]) -> int:
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in paths)


def test_the_readme_says_how_big_the_kernel_and_the_core_are() -> None:
    """``about N lines of the core's M``: both within 10% of ``wc -l`` today, so the sentence cannot rot."""
    text = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    found = re.search(r"\*\*The kernel\*\*.*? about ([\d,]+) lines of the core's ([\d,]+)", text)
    assert found, "README.md: the kernel paragraph ('**The kernel** … about N lines of the core's M') is missing"
    said_kernel, said_core = (int(g.replace(",", "")) for g in found.groups())
    kernel_files = [p for k in KERNEL for p in ([CORE / k] if k.endswith(".py") else sorted((CORE / k).rglob("*.py")))]
    assert all(p.is_file() for p in kernel_files), [str(p) for p in kernel_files if not p.is_file()]
    kernel, core = _lines(kernel_files), _lines(sorted(CORE.rglob("*.py")))
    assert abs(said_kernel - kernel) <= 0.1 * kernel, f"README says the kernel is {said_kernel} lines; it is {kernel}"
    assert abs(said_core - core) <= 0.1 * core, f"README says the core is {said_core} lines; it is {core}"
    for k in KERNEL:
        assert f"core/{k}" in text, f"README.md's kernel paragraph does not name core/{k}"
