"""The docs cannot drift: generated pages are current, every hook is documented and tested, every
page is in the nav, every plugin package has a page, and ``mkdocs build --strict`` passes."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlcore.commands import docgen
from rlcore import hookspecs

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
ALL_HOOKS = [name for name, _ in docgen.hook_functions()]


def _nav_pages() -> set[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, str):
            pages.add(node)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)

    walk(config["nav"])
    return pages


def test_every_hookspec_is_listed_by_docgen():
    declared = {n for n, f in vars(hookspecs).items() if callable(f) and hasattr(f, "rlcore_spec")}
    assert declared == set(ALL_HOOKS)


@pytest.mark.parametrize("page", list(docgen.PAGES))
def test_generated_page_is_current(page):
    assert (DOCS / page).read_text() == docgen.PAGES[page](), f"docs/{page} is stale: run python -m rlcore.commands.docgen"


@pytest.mark.parametrize("hook", ALL_HOOKS)
def test_hook_has_docs(hook):
    fn = getattr(hookspecs, hook)
    assert (fn.__doc__ or "").strip(), f"hookspec {hook} has no docstring"
    assert f"\n### {hook}\n" in (DOCS / "hooks.md").read_text()


def _test_sources() -> dict[Path, str]:
    files = list((ROOT / "tests").rglob("test_*.py")) + list((ROOT / "plugins").glob("*/*/tests/**/test_*.py"))
    return {p: p.read_text(encoding="utf-8") for p in files if p.name != Path(__file__).name}


@pytest.mark.parametrize("hook", ALL_HOOKS)
def test_hook_has_a_test(hook):
    """Some test implements or calls the hook by name (``def step(``, ``"step"``, ``.step(``) —
    the docs test itself does not count."""
    pattern = re.compile(rf"(def {hook}\(|[\"']{hook}[\"']|\.{hook}\()")
    users = [p.relative_to(ROOT).as_posix() for p, text in _test_sources().items() if pattern.search(text)]
    assert users, f"no test exercises the {hook} hook: add one under tests/ or a plugin's tests/"


def test_every_page_is_in_the_nav_and_exists():
    nav = _nav_pages()
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert on_disk - nav == set(), "pages missing from mkdocs.yml nav"
    assert nav - on_disk == set(), "nav entries without a page"


def test_every_plugin_package_has_a_page():
    nav = _nav_pages()
    for package in sorted((ROOT / "plugins").glob("*/rl-plugin-*")):
        short = package.name.removeprefix("rl-plugin-")
        assert f"plugins/{short}.md" in nav, f"{package.name} has no docs page (docs/plugins/{short}.md)"


def test_docgen_check_command():
    assert docgen.main(["--check"]) == 0


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed")
def test_mkdocs_build_strict(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").exists()
