"""The plugin system: registry, built-ins, error isolation, duplicate names, run hooks, `rlcore plugins`."""

from __future__ import annotations

import asyncio
import json
import types

import pytest

import rlcore
from rlcore import hookimpl
from rlcore.errors import PluginError, UnknownComponentError
from rlcore.plugins import Plugins, RunHooks


def test_builtin_plugins_register_like_third_party_ones():
    p = rlcore.plugins()
    builtin = [r for r in p.list() if r.builtin]
    assert {r.name for r in builtin} >= {"rlcore.rewards"}
    assert all(r.error is None for r in builtin), [r.error for r in builtin]
    assert "env_reward" in rlcore.available("reward")
    assert rlcore.get("reward", "env_reward")(total_reward=[1, 2.5]) == [1.0, 2.5]


def test_third_party_plugins_do_not_leak_into_core_tests():
    assert all(r.builtin for r in rlcore.plugins().list())


def test_unknown_name_lists_available_and_the_provider():
    with pytest.raises(UnknownComponentError) as err:
        rlcore.get("reward", "no_such_reward")
    assert "no reward named 'no_such_reward'" in str(err.value)
    assert "env_reward" in str(err.value)
    from rlcore.plugins import provider_of

    # the hint comes from rl-plugin-math's installed metadata (its rlcore.components entry points)
    assert provider_of("gsm8k_accuracy") == "rl-plugin-math", (
        "rl-plugin-math's installed metadata declares no rlcore.components: reinstall it "
        "(pip install -e plugins/rewards/rl-plugin-math, or pip install -r requirements-dev.txt)")
    with pytest.raises(UnknownComponentError) as err:
        rlcore.get("reward", "gsm8k_accuracy")
    assert str(err.value).endswith("(rl-plugin-math is installed but not in RLCORE_PLUGINS)")
    with pytest.raises(UnknownComponentError, match="unknown component kind"):
        rlcore.available("widget")


def _plugins_with(*modules: types.ModuleType) -> Plugins:
    """A Plugins instance whose 'built-ins' are the given in-memory modules (no entry points)."""
    import sys

    names = []
    for m in modules:
        sys.modules[m.__name__] = m
        names.append(m.__name__)
    return Plugins(allow=[], builtins=names)


def _module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


def test_duplicate_names_name_both_plugins_and_keep_the_first():
    @hookimpl
    def register_rewards(register):
        register("same", lambda completions: [1.0] * len(completions))

    @hookimpl
    def register_rewards_b(register):
        register("same", lambda completions: [2.0] * len(completions))

    a = _module("dup_plugin_a", register_rewards=register_rewards)
    b = _module("dup_plugin_b", register_rewards=register_rewards_b)
    b.register_rewards = register_rewards_b
    register_rewards_b.__name__ = "register_rewards"
    p = _plugins_with(a, b)
    recs = {r.name: r for r in p.list()}
    assert recs["dup_plugin_a"].error is None and recs["dup_plugin_b"].error is None  # a clash is not an error
    assert "registered by both" in recs["dup_plugin_b"].clashes[0] and recs["dup_plugin_a"].clashes == recs["dup_plugin_b"].clashes
    assert p.get("reward", "same")(completions=["x"]) == [1.0]


def test_a_plugin_that_raises_in_a_hook_does_not_take_the_others_down():
    @hookimpl
    def register_losses(register):
        raise RuntimeError("boom in registration")

    @hookimpl
    def register_rewards(register):
        register("fine", lambda completions: [0.0] * len(completions))

    bad = _module("raising_plugin", register_losses=register_losses)
    good = _module("good_plugin", register_rewards=register_rewards)
    p = _plugins_with(bad, good)
    recs = {r.name: r for r in p.list()}
    assert recs["raising_plugin"].error == "register_losses raised RuntimeError: boom in registration"
    assert p.available("reward") == ["fine"]


def test_a_module_that_fails_to_import_is_recorded_not_raised():
    p = Plugins(allow=[], builtins=["rlcore_no_such_module_xyz"])
    (rec,) = p.list()
    assert rec.error.startswith("ModuleNotFoundError")


def test_lazy_string_factories_resolve_on_first_use_and_fail_in_one_line():
    @hookimpl
    def register_samplers(register):
        register("lazy_ok", "json:dumps")
        register("lazy_bad", "no_such_pkg_abc.mod:Thing")

    p = _plugins_with(_module("lazy_plugin", register_samplers=register_samplers))
    assert p.get("sampler", "lazy_ok") is json.dumps
    with pytest.raises(PluginError) as err:
        p.get("sampler", "lazy_bad")
    assert "\n" not in str(err.value) and "lazy_bad" in str(err.value)


def test_aliases_resolve_to_the_same_component():
    @hookimpl
    def register_samplers(register):
        register("primary", "json:loads", aliases=("secondary",))

    p = _plugins_with(_module("alias_plugin", register_samplers=register_samplers))
    assert p.get("sampler", "secondary") is p.get("sampler", "primary")


class _Obs:
    name = "obs"

    def __init__(self):
        self.calls = []

    @hookimpl
    async def on_turn_end(self, infer_request, response_choice, current_turn):
        await asyncio.sleep(0)
        self.calls.append(current_turn)
        return {"infos": {"seen": current_turn}}

    @hookimpl
    def compute_reward(self, trajectories):
        return {"obs_col": [1.0] * len(trajectories)}


class _Reward:
    @hookimpl
    async def compute_reward(self, trajectories):
        return {"named": [2.0] * len(trajectories)}


class _Estimator:
    @hookimpl
    async def compute_advantage(self, rewards, groups, trajectories, config):
        return [r * 10 for r in rewards]


async def test_run_hooks_components_observers_and_first_result():
    obs = _Obs()
    hooks = RunHooks(_Reward(), _Estimator(), observer_objects=[obs])
    # components answer call_all / call_first; an observer never joins them
    assert await hooks.call_all("compute_reward", trajectories=[1, 2]) == [{"named": [2.0, 2.0]}]
    assert await hooks.call_first("compute_advantage", rewards=[1, 2], groups=[], trajectories=[], config=None) == [10, 20]
    seen = await hooks.call_observers("on_turn_end", infer_request=None, response_choice=None, current_turn=1)
    assert seen == {"obs": {"infos": {"seen": 1}}} and obs.calls == [1]
    assert await hooks.call_observers("compute_reward", trajectories=[1]) == {"obs": {"obs_col": [1.0]}}
    assert not RunHooks().implemented("compute_advantage")


def test_rlcore_plugins_json_lists_builtins(capsys):
    from rlcore.commands.cli import main

    main(["plugins", "--json", "--all"])
    data = json.loads(capsys.readouterr().out)
    names = {d["plugin"] for d in data}
    assert "rlcore.rewards" in names
    for d in data:
        assert set(d) >= {"name", "version", "hooks", "components", "error"}
    rewards = next(d for d in data if d["plugin"] == "rlcore.rewards")
    assert "register_rewards" in rewards["hooks"]
    assert "env_reward" in rewards["components"]["reward"]


def test_user_errors_print_one_line_and_exit_2(capsys):
    from rlcore.commands.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["components", "widget"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("Error: unknown component kind 'widget'") and "\n" not in err


def test_rlcore_plugins_is_the_module_and_still_callable():
    """``rlcore.plugins`` no longer shadows the module with a function: it is the module, and calling
    it returns the loaded plugin set as ``rlcore.plugins()`` always did."""
    import importlib
    import types as pytypes

    import rlcore.plugins as as_imported

    module = importlib.import_module("rlcore.plugins")
    assert as_imported is module is rlcore.plugins and isinstance(module, pytypes.ModuleType)
    assert rlcore.plugins() is module.plugins() and isinstance(rlcore.plugins(), Plugins)
    assert rlcore.plugins.get is rlcore.get


def test_rlcore_plugins_naming_a_distribution_that_is_not_installed_is_shown():
    """RLCORE_PLUGINS=rl-plugin-mth (a typo) used to load nothing without a word: `rlcore plugins`
    said no plugins were installed and runs failed on names the intended package provides."""
    p = Plugins(allow=["rl-plugin-math", "rl_plugin_mth", "rlcore"])
    assert "gsm8k_accuracy" in p.available("reward")  # the real one still loads
    broken = [r for r in p.list() if r.error]
    assert [r.dist for r in broken] == ["rl-plugin-mth"], [r.error for r in broken]
    assert "RLCORE_PLUGINS names 'rl-plugin-mth'" in broken[0].error and "rl-plugin-math" in broken[0].error
    with pytest.raises(UnknownComponentError, match="RLCORE_PLUGINS names 'rl-plugin-mth'"):
        p.get("reward", "no_such_reward_anywhere")
    assert not [r for r in Plugins(allow=["rl-plugin-math", "rlcore"]).list() if r.error]


def test_components_shows_option_types_as_a_user_reads_them(capsys):
    """`rlcore components KIND NAME` printed Python's "(NoneType, str, default None)"."""
    from rlcore.commands.cli import main

    main(["components", "scheduler", "multi_turn"])
    out = capsys.readouterr().out
    assert "--max-turns (int | None, default None)" in out and "NoneType" not in out
