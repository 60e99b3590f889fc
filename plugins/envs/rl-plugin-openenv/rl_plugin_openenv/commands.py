"""``rlcore openenv …`` commands (added through the ``register_commands`` hook)."""

from __future__ import annotations

from typing import Any

import click


def add_commands(cli: Any) -> None:
    """Attach the ``openenv`` group to the root ``rlcore`` click group."""

    @cli.group(name="openenv")
    def openenv_group() -> None:
        """OpenEnv environment servers (rl-plugin-openenv)."""

    @openenv_group.command(name="serve")
    @click.argument("name", default="guess_number")
    @click.option("--port", "-p", type=int, default=8000, show_default=True)
    @click.option("--host", default="127.0.0.1", show_default=True,
                  help="Interface to bind; anything but 127.0.0.1 exposes the environment to the network.")
    @click.option("--max-concurrent-envs", type=int, default=64, show_default=True,
                  help="Sessions (one per trajectory) the server runs at once; more get CAPACITY_REACHED.")
    @click.option("--step-delay", type=float, default=0.0, show_default=True,
                  help="Seconds each step waits (simulates a slow environment).")
    @click.option("--idle-timeout", type=float, default=600.0, show_default=True,
                  help="End a session that sent nothing for this many seconds (0: never).")
    @click.option("--ping-interval", type=float, default=20.0, show_default=True,
                  help="WebSocket keep-alive ping period; a client silent to pings as long again is dropped (0: off).")
    def serve_command(name: str, port: int, host: str, max_concurrent_envs: int, step_delay: float,
                      idle_timeout: float, ping_interval: float) -> None:
        """Serve environment NAME (guess_number, guess_number_mcp) with OpenEnv's create_app + uvicorn."""
        from .games import GAMES
        from .server import serve

        if not 1 <= port <= 65535:  # was an 87-line OverflowError from the socket bind
            from rlcore.errors import ConfigError

            raise ConfigError(f"--port must be a TCP port from 1 to 65535, got {port}")
        if name not in GAMES:
            raise click.BadParameter(f"unknown environment {name!r}; choose one of: {', '.join(sorted(GAMES))}",
                                     param_hint="NAME")
        click.echo(f"serving OpenEnv environment {name!r} on http://{host}:{port} "
                   f"(max {max_concurrent_envs} sessions; Ctrl-C stops)")
        serve(name, host=host, port=port, max_concurrent_envs=max_concurrent_envs, step_delay=step_delay,
              idle_timeout=idle_timeout or None, ping_interval=ping_interval or None, ping_timeout=ping_interval or None)

    @openenv_group.command(name="list")
    def list_command() -> None:
        """List the environments this package can serve."""
        from .games import GAMES, game

        for name in sorted(GAMES):
            doc = (game(name)[0].__doc__ or "").strip().splitlines()[0]
            click.echo(f"{name}: {doc}")
