"""``python -m rl_plugin_openenv serve NAME --port P``: the ``rlcore openenv`` commands without rlcore's CLI."""

from __future__ import annotations

import click

from .commands import add_commands


@click.group()
def _root() -> None:
    """rl-plugin-openenv."""


add_commands(_root)

if __name__ == "__main__":
    _root(args=None, prog_name="python -m rl_plugin_openenv")
