"""Registration hooks that other tests do not reach directly: register_advantages and register_commands."""

from __future__ import annotations

import sys
import types

import click
import torch
from click.testing import CliRunner

import rlcore
from rlcore import RunHooks, hookimpl
from rlcore.plugins import Plugins


def _plugin(name: str, **hooks) -> str:
    mod = types.ModuleType(name)
    for k, v in hooks.items():
        setattr(mod, k, v)
    sys.modules[name] = mod
    return name


class MeanBaseline:
    """A third-party estimator: reward minus the batch mean."""

    def __init__(self, config=None):
        self.config = config

    @hookimpl
    def compute_advantage(self, rewards, groups, trajectories, config):
        return rewards - rewards.mean()


def test_register_advantages_adds_an_estimator_the_run_calls():
    @hookimpl
    def register_advantages(register):
        register("mean_baseline", MeanBaseline)

    p = Plugins(allow=[], builtins=[_plugin("adv_plugin_t", register_advantages=register_advantages)])
    assert p.available("advantage") == ["mean_baseline"]
    estimator = p.get("advantage", "mean_baseline")(config=None)
    hooks = RunHooks(estimator, observers=False)
    import asyncio

    adv = asyncio.run(
        hooks.call_first("compute_advantage", rewards=torch.tensor([1.0, 3.0]), groups=["g", "g"], trajectories=[], config=None)
    )
    assert adv.tolist() == [-1.0, 1.0]


def test_builtin_advantages_are_registered():
    assert {"grpo", "rloo", "reinforce_plus_plus", "gigpo"} <= set(rlcore.available("advantage"))


def test_register_commands_adds_a_subcommand_to_the_cli():
    @hookimpl
    def register_commands(cli):
        @cli.command(name="hello-plugin")
        @click.argument("who")
        def hello(who):
            """Say hello from a plugin."""
            click.echo(f"hello {who}")

    p = Plugins(allow=[], builtins=[_plugin("cmd_plugin_t", register_commands=register_commands)])

    @click.group()
    def root():
        pass

    p.register_commands(root)
    result = CliRunner().invoke(root, ["hello-plugin", "world"])
    assert result.exit_code == 0 and result.output == "hello world\n"
    assert "hello-plugin" in CliRunner().invoke(root, ["--help"]).output


def test_a_broken_register_commands_is_recorded_and_the_cli_still_works():
    @hookimpl
    def register_commands(cli):
        raise RuntimeError("cannot add commands")

    p = Plugins(allow=[], builtins=[_plugin("bad_cmd_plugin_t", register_commands=register_commands)])

    @click.group()
    def root():
        pass

    p.register_commands(root)
    (rec,) = p.list()
    assert rec.error == "register_commands raised RuntimeError: cannot add commands"
    assert CliRunner().invoke(root, ["--help"]).exit_code == 0
