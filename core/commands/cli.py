"""The ``rlcore`` command. Subcommands come from built-in modules and from plugins'
``register_commands`` hooks, so ``rlcore openenv serve`` appears when rl-plugin-openenv is installed."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ..errors import RewardFunctionError, RlcoreError
from ..plugins import plugins


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rlcore")
def cli() -> None:
    """rlcore: GRPO-family reinforcement learning for LLMs, with plugins for everything you swap."""


@cli.command(name="plugins")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--all", "show_all", is_flag=True, help="Include rlcore's built-in plugins.")
def plugins_command(as_json: bool, show_all: bool) -> None:
    """List installed plugins: distribution, version, components per kind, hooks, errors."""
    records = [r for r in plugins().list() if show_all or not r.builtin]
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in records], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rlcore plugins" + (" (incl. built-in)" if show_all else ""))
    for col in ("distribution", "version", "components", "hooks", "error / clash"):
        table.add_column(col, overflow="fold")
    for r in records:
        comps = "\n".join(f"{k}: {', '.join(sorted(v))}" for k, v in sorted(r.components.items()))
        table.add_row(
            r.dist if not r.builtin else f"{r.dist} ({r.name})",
            r.version or "-",
            comps or "-",
            "\n".join(sorted(r.hooks)) or "-",
            "\n".join(([f"[red]{r.error}[/red]"] if r.error else []) + [f"[yellow]clash: {c}[/yellow]" for c in r.clashes]),
        )
    console = Console(width=max(Console().width, 120))
    if not records:
        console.print("No third-party plugins installed. `rlcore plugins --all` shows the built-in ones.")
        return
    console.print(table)


@cli.command(name="components")
@click.argument("kind", required=False)
@click.argument("name", required=False)
def components_command(kind: str | None, name: str | None) -> None:
    """List registered component names per kind (scheduler, env, reward, loss, advantage, sampler);
    with KIND NAME, the options that component declares (its --flags and <kind>_options keys)."""
    from ..hookspecs import KINDS

    p = plugins()
    if kind and name:
        from ..rollout.options import describe_options

        lines = describe_options(p.get(kind, name), kind)
        click.echo(f"{kind} {name!r} options: " + ("\n  " + "\n  ".join(lines) if lines else "none"))
        return
    for k in [kind] if kind else list(KINDS):
        aliases = p.aliases(k)  # a name the docs use (`vllm_server`) is listed beside the one it stands for
        names = [n + (f" (alias {', '.join(aliases[n])})" if aliases.get(n) else "") for n in p.available(k)]
        click.echo(f"{k}: {', '.join(names) if names else '-'}")


#: built-in command modules, each with ``register(cli)``; absent ones are skipped
_BUILTIN_COMMAND_MODULES = ("rlcore.commands.rollout", "rlcore.commands.train", "rlcore.commands.scaffold")


#: what ``rlcore`` answers without loading any plugin (a plugin that takes 30 s to import, or one that
#: is broken, must not slow or stop ``rlcore --version``)
_NO_PLUGIN_ARGS = ("--version", "-h", "--help")
_PLUGIN_COMMANDS_NOTE = ("Installed plugins may add commands; plugins are not loaded for this help: `rlcore plugins` "
                         "lists them and their hooks (register_commands), `rlcore COMMAND --help` shows one.")


def _load_commands(plugin_commands: bool = True) -> None:
    """Register the built-in commands, and (``plugin_commands``) those of installed plugins."""
    import importlib

    for modname in _BUILTIN_COMMAND_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name == modname:
                continue
            raise
        mod.register(cli)
    if plugin_commands:
        plugins().register_commands(cli)


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry: user errors print one line and exit 2; bugs keep their traceback.
    ``rlcore --version`` and ``rlcore --help`` load no plugin (their commands are not listed then)."""
    args = list(sys.argv[1:] if argv is None else argv)
    with_plugins = not all(a in _NO_PLUGIN_ARGS for a in args)
    try:
        _load_commands(plugin_commands=with_plugins)
    except KeyboardInterrupt:  # a Ctrl-C while plugins load (a slow one): stop, as at any other moment
        click.echo("Aborted.", err=True)
        sys.exit(130)
    epilog = cli.epilog
    if not with_plugins:
        cli.epilog = _PLUGIN_COMMANDS_NOTE
    try:
        return cli.main(args=args, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.exceptions.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except RlcoreError as exc:
        if isinstance(exc, RewardFunctionError) and exc.__cause__ is not None:
            click.echo(user_traceback(exc.__cause__), err=True)  # the message points at it: where the reward broke
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
    finally:
        cli.epilog = epilog


def user_traceback(exc: BaseException) -> str:
    """``exc``'s traceback without rlcore's own frames: the lines of the user's code (a reward
    function) that raised, which a one-line error cannot carry."""
    import os
    import traceback

    import asyncio
    import concurrent.futures
    import threading

    machinery = tuple(os.path.dirname(os.path.abspath(m.__file__ or "")) for m in (asyncio, concurrent.futures))
    machinery += (os.path.dirname(os.path.abspath(__file__)), os.path.abspath(threading.__file__ or ""))
    frames = traceback.extract_tb(exc.__traceback__)
    last = max((i for i, f in enumerate(frames) if os.path.abspath(f.filename).startswith(machinery)), default=-1)
    frames = frames[last + 1:] or frames  # what ran after rlcore and the thread/event-loop plumbing handed over
    lines = ["Traceback (most recent call last; rlcore's frames left out):\n"]
    lines += traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip()


if __name__ == "__main__":  # pragma: no cover
    main()
