"""``rlcore new plugin KIND NAME``: write a complete, installable plugin package.

Writing a plugin should take minutes, so the generator produces everything a plugin package needs
and nothing it does not: a ``pyproject.toml`` with the ``rlcore`` entry point, a registration
module that stays cheap to import (factories named as ``"module:attr"`` strings, resolved on first
use), one module with a working example of the kind, tests that pass as generated against the real
core, and a README. Templates live in ``scaffold_templates/`` next to this file: ``common/`` is
shared by every kind, ``<kind>/`` adds the kind's own files. ``__pkg__`` in a template's path and
``{{key}}`` in its text are replaced; a trailing ``.tmpl`` is dropped (so the templates are never
collected or imported as real modules).
"""

from __future__ import annotations

import builtins
import keyword
import re
from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError, UnknownComponentError

#: the kinds ``rlcore new plugin`` can write, with the one-line summary used in pyproject/README
SCAFFOLD_KINDS: dict[str, str] = {
    "scheduler": "a multi-turn rollout scheduler (MultiTurnScheduler subclass, the ms-swift way)",
    "env": "a text environment (rlcore.envs.Env subclass) that env schedulers can run",
    "reward": "a reward function that names the inputs it needs",
    "loss": "a policy loss with rlcore's loss signature",
    "advantage": "an advantage estimator implementing the compute_advantage hook",
    "sampler": "a token-in/token-out generation backend (rlcore.sampling.Sampler subclass)",
}

TEMPLATES = Path(__file__).parent / "scaffold_templates"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_TOKEN = re.compile(r"\{\{(\w+)\}\}")
_CLASS_SUFFIX = {"scheduler": "Scheduler", "env": "Env", "sampler": "Sampler", "advantage": "Advantage"}
#: module-level names the templates use; a generated class or function must not take one of them
_TEMPLATE_GLOBALS = frozenset({
    "annotations", "asyncio", "inspect", "os", "random", "re", "threading", "torch", "rlcore",
    "hookimpl", "register", "Any", "Callable", "Completion", "Env", "MultiTurnScheduler", "Sampler",
    "SamplingParams", "Trajectory", "WORDS", "FINAL_ANSWER", "NUMBER", "score",
})


def validate_name(name: str) -> str:
    """Return ``name`` if it can be a component name, a Python package suffix and a distribution
    suffix all at once; otherwise raise one :class:`ConfigError` saying what a good name looks like."""
    if not _NAME.match(name or "") or name.endswith("_") or "__" in name:
        raise ConfigError(
            f"invalid plugin name {name!r}: use lowercase letters, digits and single underscores, "
            "starting with a letter (for example: my_reward)"
        )
    if keyword.iskeyword(name):
        raise ConfigError(f"invalid plugin name {name!r}: it is a Python keyword; pick another name (for example: my_{name})")
    return name


def template_values(kind: str, name: str) -> dict[str, str]:
    """Everything the templates substitute, derived from ``kind`` and ``name``."""
    class_name = "".join(part.capitalize() for part in name.split("_"))
    if kind in _CLASS_SUFFIX and not class_name.endswith(_CLASS_SUFFIX[kind]):
        class_name += _CLASS_SUFFIX[kind]
    if class_name in _TEMPLATE_GLOBALS:  # ``class Env(Env)`` would subclass itself
        class_name = "My" + class_name
    # a function named like a builtin or a module-level name (``zip``, ``torch``) would shadow it
    func = f"{name}_{kind}" if hasattr(builtins, name) or name in _TEMPLATE_GLOBALS else name
    return {
        "kind": kind,
        "name": name,
        "dist": "rl-plugin-" + name.replace("_", "-"),
        "pkg": "rl_plugin_" + name,
        "Class": class_name,
        "func": func,
        "summary": SCAFFOLD_KINDS[kind],
    }



def _render(text: str, values: dict[str, str]) -> str:
    return _TOKEN.sub(lambda m: values[m.group(1)], text)


def _template_files(kind: str) -> list[tuple[Path, Path]]:
    """(template file, output path relative to the package root) for ``kind``, common files first;
    a kind's file with the same output path replaces the common one."""
    out: dict[Path, Path] = {}
    for root in (TEMPLATES / "common", TEMPLATES / kind):
        for src in sorted(root.rglob("*")):
            if src.is_file() and "__pycache__" not in src.parts:
                rel = src.relative_to(root)
                if rel.name.endswith(".tmpl"):
                    rel = rel.with_name(rel.name[: -len(".tmpl")])
                out[rel] = src
    return [(src, rel) for rel, src in out.items()]


def _check_name_free(kind: str, name: str) -> None:
    """Refuse a name the installed plugins already use for this kind: the new package would fail
    to register it ("registered by both ...") the moment it is installed."""
    from ..plugins import plugins

    try:
        taken = plugins().component(kind, name)
    except UnknownComponentError:  # the good case
        return
    raise ConfigError(f"{kind} name {name!r} is already registered by {taken.dist}; pick another name")


def new_plugin(kind: str, name: str, directory: str | Path = ".") -> Path:
    """Write the plugin package ``rl-plugin-<name>`` for ``kind`` under ``directory`` and return its
    path. Never overwrites: an existing target directory is an error."""
    if kind not in SCAFFOLD_KINDS:
        raise ConfigError(f"unknown plugin kind {kind!r}; kinds are: {', '.join(SCAFFOLD_KINDS)}")
    validate_name(name)
    _check_name_free(kind, name)
    values = template_values(kind, name)
    target = Path(directory).expanduser().resolve() / values["dist"]
    if target.exists():
        raise ConfigError(f"{target} already exists; remove it or choose another --dir or NAME")
    files = _template_files(kind)
    made = _missing_parents(target)
    try:
        target.mkdir(parents=True)
        for src, rel in files:
            dest = target / Path(*(part.replace("__pkg__", values["pkg"]) for part in rel.parts))
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(_render(src.read_text(encoding="utf-8"), values), encoding="utf-8")
    except OSError as exc:  # a read-only or full place: one line, and no half-written package left behind
        import shutil

        for path in made:  # only what this call created, deepest first
            shutil.rmtree(path, ignore_errors=True)
        raise ConfigError(f"cannot write the plugin package to {target}: {exc.strerror or exc}"
                          f"{f' ({exc.filename})' if exc.filename and str(exc.filename) != str(target) else ''}; "
                          "pass a --dir you can write to") from None
    return target


def _missing_parents(target: Path) -> list[Path]:
    """``target`` and those of its parents that do not exist yet, deepest first (what writing it creates)."""
    out = []
    for path in [target, *target.parents]:
        if path.exists():
            break
        out.append(path)
    return out


def register(cli: Any) -> None:
    """Add ``rlcore new plugin`` to the command line (called by :mod:`rlcore.commands.cli`)."""

    @cli.group(name="new")
    def new_group() -> None:
        """Create new things from templates."""

    @new_group.command(name="plugin")
    @click.argument("kind", type=click.Choice(list(SCAFFOLD_KINDS)))
    @click.argument("name")
    @click.option(
        "--dir", "directory", default=".", show_default=True, type=click.Path(file_okay=False),
        help="Where to create the package directory rl-plugin-NAME.",
    )
    def new_plugin_command(kind: str, name: str, directory: str) -> None:
        """Write a plugin package of KIND registering NAME: pyproject with the rlcore entry point,
        a working example, tests and a README.

        KIND is one of: scheduler, env, reward, loss, advantage, sampler.
        """
        path = new_plugin(kind, name, directory)
        values = template_values(kind, name)
        click.echo(f"Created {values['dist']} ({kind} {name!r}) in {path}")
        click.echo("Next:")
        click.echo(f"  python -m pip install -e {path}")
        click.echo("  rlcore plugins")
        click.echo(f"  cd {path} && python -m pytest -q")
