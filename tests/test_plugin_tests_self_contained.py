"""Every plugin package in ``plugins/`` is copyable as a template: its tests read nothing outside the
package (no ``Path(__file__).parents[k]`` above the package root, no path into the repository's
``examples/``). The repository's examples are tested in ``tests/test_example_*.py``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p for p in (ROOT / "plugins").glob("*/*") if (p / "pyproject.toml").is_file())


def _escapes(path: Path, package: Path) -> list[str]:
    """Lines of ``path`` (a test file under ``package``) that reach above the package root."""
    depth = len(path.relative_to(package).parts) - 1  # parents[depth - 1] is the package root
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents":
            k = node.slice.value if isinstance(node.slice, ast.Constant) else None
            if isinstance(k, int) and k >= depth:
                found.append(f"line {node.lineno}: parents[{k}] is above {package.name}")
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            chain, inner = 1, node.value
            while isinstance(inner, ast.Attribute) and inner.attr == "parent":
                chain, inner = chain + 1, inner.value
            if chain > depth:
                found.append(f"line {node.lineno}: .parent x{chain} is above {package.name}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings and (
                "../.." in node.value or node.value.startswith("examples/") or "/examples/" in node.value):
            found.append(f"line {node.lineno}: {node.value[:60]!r} points outside the package")
    return found


def test_the_package_list_is_the_plugin_folders() -> None:
    assert {p.name for p in PACKAGES} >= {"rl-plugin-math", "rl-plugin-openenv", "rl-plugin-gym", "rl-plugin-tips"}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_plugin_tests_read_nothing_outside_their_package(package: Path) -> None:
    bad = {str(f.relative_to(ROOT)): _escapes(f, package) for f in sorted((package / "tests").rglob("*.py"))}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"plugin tests that break when the package is copied elsewhere: {bad}"
