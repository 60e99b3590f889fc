"""End to end: a brand-new plugin package, really pip-installed, shows up in `rlcore plugins` and the registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import rlcore
from rlcore.testing.packages import installed, write_plugin_package


SCHEDULER_PLUGIN = '''
import rlcore


class EchoScheduler:
    """A toy scheduler: enough to prove registration; rollouts are tested elsewhere."""

    def __init__(self, **options):
        self.options = options


@rlcore.hookimpl
def register_schedulers(register):
    register("echo_scheduler_e2e", EchoScheduler)


@rlcore.hookimpl
def on_turn_end(infer_request, response_choice, current_turn):
    return None
'''

BROKEN_PLUGIN = '''
raise ImportError("this plugin needs libfoo; pip install libfoo")
'''


def _plugins_json(allow: str) -> list[dict]:
    env = dict(os.environ, RLCORE_PLUGINS=allow)
    out = subprocess.run(
        [sys.executable, "-m", "rlcore.commands.cli", "plugins", "--json"], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout)


def test_new_plugin_package_is_listed_and_its_scheduler_resolves(tmp_path, monkeypatch):
    dist = "rlcore-e2e-echo-plugin"
    pkg = write_plugin_package(tmp_path, dist, "rlcore_e2e_echo", SCHEDULER_PLUGIN)
    with installed(pkg, dist):
        listed = _plugins_json(dist)
        (entry,) = [d for d in listed if d["name"] == dist]
        assert entry["version"] == "0.0.1"
        assert entry["error"] is None
        assert entry["components"] == {"scheduler": ["echo_scheduler_e2e"]}
        assert set(entry["hooks"]) == {"register_schedulers", "on_turn_end"}

        monkeypatch.setenv("RLCORE_PLUGINS", dist)
        rlcore.reload_plugins()
        factory = rlcore.get("scheduler", "echo_scheduler_e2e")
        assert factory(max_turns=3).options == {"max_turns": 3}
        # a plugin implementing a lifecycle hook may be named as an observer; it joins no run by itself
        assert any(getattr(m, "__name__", "") == "rlcore_e2e_echo" for m in rlcore.plugins().observers())
        hooks = rlcore.RunHooks()
        assert not hooks.pm.get_plugins()
        assert rlcore.RunHooks(observers=[dist]).observer_names

        # the allow-list keeps it out when not named
        monkeypatch.setenv("RLCORE_PLUGINS", "")
        rlcore.reload_plugins()
        with pytest.raises(rlcore.UnknownComponentError):
            rlcore.get("scheduler", "echo_scheduler_e2e")
    rlcore.reload_plugins()
    # uninstalled but still named in RLCORE_PLUGINS: listed as that error, with nothing registered
    (gone,) = [d for d in _plugins_json(dist) if d["name"] == dist]
    assert "no installed distribution" in gone["error"] and not gone["components"] and not gone["hooks"]


def test_plugin_whose_import_raises_is_shown_with_its_error(tmp_path, monkeypatch):
    good_dist, bad_dist = "rlcore-e2e-good-plugin", "rlcore-e2e-broken-plugin"
    good = write_plugin_package(tmp_path, good_dist, "rlcore_e2e_good", SCHEDULER_PLUGIN.replace("echo_scheduler_e2e", "good_e2e"))
    bad = write_plugin_package(tmp_path, bad_dist, "rlcore_e2e_broken", BROKEN_PLUGIN)
    with installed(good, good_dist), installed(bad, bad_dist):
        listed = {d["name"]: d for d in _plugins_json(f"{good_dist},{bad_dist}")}
        assert listed[bad_dist]["error"] == "ImportError: this plugin needs libfoo; pip install libfoo"
        assert listed[good_dist]["error"] is None
        assert listed[good_dist]["components"] == {"scheduler": ["good_e2e"]}

        # the table form still works with a broken plugin installed
        env = dict(os.environ, RLCORE_PLUGINS=f"{good_dist},{bad_dist}", COLUMNS="200")
        table = subprocess.run([sys.executable, "-m", "rlcore.commands.cli", "plugins"], capture_output=True, text=True, env=env)
        assert table.returncode == 0 and bad_dist in table.stdout and "libfoo" in table.stdout

        # asking for a name nobody registered points at the broken plugin and its one-line error
        monkeypatch.setenv("RLCORE_PLUGINS", f"{good_dist},{bad_dist}")
        rlcore.reload_plugins()
        with pytest.raises(rlcore.UnknownComponentError) as err:
            rlcore.get("scheduler", "what_the_broken_one_had")
        assert f"{bad_dist}: ImportError: this plugin needs libfoo" in str(err.value)


def test_duplicate_names_first_keeps_it_both_load_and_an_explicit_setting_picks(tmp_path, monkeypatch):
    """Policy for a name two installed packages register (an ms-swift port registering a name
    rl-plugin-gym owns): the first (alphabetical distribution) keeps the plain name, every other
    component of both still loads, `rlcore plugins` shows the clash, `DIST:NAME` or RLCORE_PREFER
    picks the other."""
    a, b = "rlcore-e2e-dup-a", "rlcore-e2e-dup-b"

    def src(origin: str, extra: str) -> str:
        return SCHEDULER_PLUGIN.replace('register("echo_scheduler_e2e", EchoScheduler)',
                                        f'register("dup_e2e", EchoScheduler)\n    register("{extra}", EchoScheduler)').replace(
            "self.options = options", f"self.options = options\n        self.origin = {origin!r}")

    pa = write_plugin_package(tmp_path, a, "rlcore_e2e_dup_a", src("a", "only_a_e2e"))
    pb = write_plugin_package(tmp_path, b, "rlcore_e2e_dup_b", src("b", "only_b_e2e"))
    with installed(pb, b), installed(pa, a):
        listed = {d["name"]: d for d in _plugins_json(f"{a},{b}")}
        assert listed[a]["error"] is None and listed[b]["error"] is None
        assert listed[a]["components"] == {"scheduler": ["dup_e2e", "only_a_e2e"]}
        assert listed[b]["components"] == {"scheduler": ["dup_e2e", "only_b_e2e"]}
        for d in (a, b):
            (clash,) = listed[d]["clashes"]
            assert f"{a} keeps the name" in clash and f"'{b}:dup_e2e'" in clash

        monkeypatch.setenv("RLCORE_PLUGINS", f"{a},{b}")
        rlcore.reload_plugins()
        assert rlcore.get("scheduler", "dup_e2e")().origin == "a"
        assert rlcore.get("scheduler", f"{b}:dup_e2e")().origin == "b"
        assert rlcore.get("scheduler", "only_b_e2e")().origin == "b"  # the second's other components load

        monkeypatch.setenv("RLCORE_PREFER", f"dup_e2e={b}")
        rlcore.reload_plugins()
        assert rlcore.get("scheduler", "dup_e2e")().origin == "b"
        assert rlcore.get("scheduler", f"{a}:dup_e2e")().origin == "a"

        # the table shows the clash too
        env = dict(os.environ, RLCORE_PLUGINS=f"{a},{b}", COLUMNS="250")
        env.pop("RLCORE_PREFER", None)
        table = subprocess.run([sys.executable, "-m", "rlcore.commands.cli", "plugins"], capture_output=True, text=True, env=env)
        assert table.returncode == 0 and "clash" in table.stdout
    monkeypatch.delenv("RLCORE_PREFER")
    rlcore.reload_plugins()
