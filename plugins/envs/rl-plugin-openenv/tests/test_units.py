"""Server-free pieces: action parsing, observation formatting, env_config merging, the session
limiter, plugin registration and the `rlcore openenv` commands."""

from __future__ import annotations

import asyncio

import pytest
import rlcore
from click.testing import CliRunner
from rlcore.errors import ConfigError

from rl_plugin_openenv.actions import format_observation, parse_action, strip_code_fences
from rl_plugin_openenv.env import OpenEnvEnv, merge_env_config
from rl_plugin_openenv.limiter import SessionLimiter, http_url, ws_url


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ('{"guess": 4}', {"guess": 4}),
        ('```json\n{"guess": 4}\n```', {"guess": 4}),
        ('```\n{"a": [1, 2]}\n```', {"a": [1, 2]}),
        ('I pick {"guess": 9} now', {"guess": 9}),
        ("just words", {"message": "just words"}),
        ("[1, 2]", {"message": "[1, 2]"}),  # JSON but not an object
        ('{"guess": 4', {"message": '{"guess": 4'}),  # broken JSON
        ("", {"message": ""}),
    ],
)
def test_parse_action(text, action):
    assert parse_action(text) == action


def test_strip_code_fences_leaves_plain_text():
    assert strip_code_fences("  hello ") == "hello"


def test_format_observation():
    assert format_observation({"text": "too low", "attempts_left": 3, "metadata": {}, "low": None}) == "too low\nattempts_left: 3"
    assert format_observation({"board": [[1]], "metadata": {"x": 1}}) == '{"board": [[1]]}'
    assert format_observation({"metadata": {"text": "from metadata"}}) == "from metadata"
    assert format_observation("plain") == "plain"
    mcp_ok = {"tool_name": "t", "result": {"content": [{"type": "text", "text": "42"}]}, "error": None}
    assert format_observation(mcp_ok) == "42"
    mcp_err = {"tool_name": "t", "result": None, "error": {"message": "bad args\nmore"}}
    assert format_observation(mcp_err) == "Error: bad args"


def test_merge_env_config_and_reset_kwargs():
    defaults = {"base_url": "http://a:1", "reset_kwargs": {"low": 1, "high": 9}, "call_timeout": 30}
    merged = merge_env_config(defaults, {"env_url": "http://b:2", "reset_kwargs": {"high": 5}, "seed": 3})
    assert merged["base_url"] == "http://b:2" and merged["reset_kwargs"] == {"low": 1, "high": 5}
    env = OpenEnvEnv(merged)
    assert env.reset_kwargs() == {"seed": 3, "low": 1, "high": 5}
    assert env.session.options.call_timeout == 30
    assert merge_env_config(defaults, '{"seed": 1}')["seed"] == 1
    with pytest.raises(ConfigError, match="--env-url"):
        merge_env_config({"base_url": None}, {})
    with pytest.raises(ConfigError, match="JSON object"):
        merge_env_config(defaults, "not json")


def test_urls():
    assert ws_url("http://127.0.0.1:8000/") == "ws://127.0.0.1:8000/ws"
    assert ws_url("https://h") == "wss://h/ws"
    assert http_url("ws://h:1/ws") == "http://h:1" and http_url("h:1") == "http://h:1"


async def test_limiter_queues_shrinks_and_survives_cancellation():
    lim = SessionLimiter(2)
    await lim.acquire()
    await lim.acquire()
    waiter = asyncio.create_task(lim.acquire())
    cancelled = asyncio.create_task(lim.acquire())
    await asyncio.sleep(0.01)
    assert lim.waiting == 2 and not waiter.done()
    cancelled.cancel()
    await asyncio.sleep(0.01)
    lim.release()
    await asyncio.wait_for(waiter, 1)  # the slot goes to the live waiter, not the cancelled one
    assert lim.in_use == 2
    lim.shrink_to(1)
    lim.release()
    lim.release()
    assert lim.in_use == 0 and lim.limit == 1
    lim.shrink_to(5)  # never grows
    assert lim.limit == 1


def test_registered_components():
    assert "openenv_scheduler" in rlcore.available("scheduler")
    assert "openenv_tool_scheduler" in rlcore.available("scheduler")
    assert rlcore.get("reward", "openenv_reward")(total_reward=[0.5, 2]) == [0.5, 2.0]
    assert rlcore.get("env", "openenv") is OpenEnvEnv


def test_invalid_options_are_one_line():
    factory = rlcore.get("scheduler", "openenv_scheduler")
    with pytest.raises(ConfigError, match="invalid_action"):
        factory(invalid_action="ignore")
    with pytest.raises(ConfigError, match="max_concurrent_envs"), pytest.warns(FutureWarning):
        factory(max_concurrent_envs=0)
    with pytest.raises(ConfigError, match="sessions_per_server"):
        factory(sessions_per_server=0)


def test_sessions_per_server_is_the_schedulers_name_and_the_old_one_still_works():
    factory = rlcore.get("scheduler", "openenv_scheduler")
    sched = factory(env_url="http://127.0.0.1:9", sessions_per_server=3)
    assert sched.sessions_per_server == 3 and sched.max_env_calls == 3  # the session cap bounds env calls
    with pytest.warns(FutureWarning, match="max_concurrent_envs is deprecated, use sessions_per_server"):
        old = factory(env_url="http://127.0.0.1:9", max_concurrent_envs=5)
    assert old.sessions_per_server == 5
    assert factory(env_url="http://127.0.0.1:9").sessions_per_server is None  # ask the server


def test_openenv_commands_registered_on_rlcore_cli():
    from rlcore.commands.cli import _load_commands, cli

    _load_commands()
    runner = CliRunner()
    out = runner.invoke(cli, ["openenv", "list"])
    assert out.exit_code == 0 and "guess_number:" in out.output and "guess_number_mcp:" in out.output
    bad = runner.invoke(cli, ["openenv", "serve", "chess", "--port", "1"])
    assert bad.exit_code != 0 and "unknown environment 'chess'" in bad.output
    helptext = runner.invoke(cli, ["openenv", "serve", "--help"]).output
    assert "--max-concurrent-envs" in helptext and "127.0.0.1" in helptext
