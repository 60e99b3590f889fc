"""Hostile model output through every built-in tool and every installed reward: each call ends
within a bound (no hang) and without a memory spike (an address-space cap is set around it).

The bound here is a hang detector, not a benchmark: ``SAMPLE_TIMEOUT`` per math-verify check plus a
worker restart and generous slack for a loaded CI machine.
"""

from __future__ import annotations

import asyncio
import math
import os
import resource
import time
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

import rlcore
from rlcore.asyncutil import run_sync
from rlcore.plugins import RunHooks
from rlcore.rewards import as_reward, compute_rewards
from rlcore.rollout.tools import ToolManager, ToolScheduler, calculator
from rlcore.testing.fuzz import HOSTILE_COMPLETIONS
from rlcore.types import Trajectory, Turn

SAMPLE_TIMEOUT = 1.0
BOUND_S = 60.0  # per (reward, completion): far above a healthy call, far below a hang
EXTRA_MEMORY = 1 << 30  # 1 GiB of address space on top of what the test process holds


@contextmanager
def memory_cap(extra: int = EXTRA_MEMORY) -> Iterator[None]:
    """Lower this process's address-space limit to what it holds now + ``extra`` for the block."""
    with open("/proc/self/statm", encoding="ascii") as f:
        vsize = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vsize + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def hostile_trajectory(text: str, **data: Any) -> Trajectory:
    t = Trajectory(prompt_ids=[1, 2, 3], messages=[{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": text}],
                   data=dict(data))
    t.prompt_ids = [1, 2, 3]
    n = min(len(text), 4096)  # as if sampled: one token per character, up to a length limit
    t.turns.append(Turn(token_ids=[7] * n, loss_mask=[1] * n, logprobs=[-1.0] * n, text=text))
    return t


@pytest.mark.parametrize("name", sorted(HOSTILE_COMPLETIONS))
def test_calculator_and_tool_parsing_stay_bounded(name: str) -> None:
    text = HOSTILE_COMPLETIONS[name]
    manager = ToolManager([calculator])
    with memory_cap():
        t0 = time.monotonic()
        try:
            calculator(text)  # the raw text as an expression
        except (ValueError, OverflowError, ZeroDivisionError, TypeError):
            pass  # refused: fine; what matters is that it returned
        replies = run_sync(manager.run(text))  # the text as a completion full of tool calls
        elapsed = time.monotonic() - t0
    assert elapsed < BOUND_S, f"{name}: tools took {elapsed:.1f}s"
    assert len(replies) <= ToolManager.max_calls
    assert all(len(r["content"]) < 20_000 for r in replies)


@pytest.mark.parametrize("parser_name", ["hermes", "qwen3_xml", "llama3_json", "gptoss", "deepseek_v3", "gemma4", "muse_atem",
                                         "response_schema"])
def test_every_tool_parser_stays_bounded_and_never_raises(parser_name: str, tiny_tokenizer: Any) -> None:
    """Each family's parser over every hostile completion (the ``response_schema`` one with TRL's
    gpt-oss schema, whose regexes are quadratic: it reads a bounded length)."""
    import copy

    from rlcore.rollout.tool_parsers import make_tool_parser, trl_template_dir

    tok = copy.copy(tiny_tokenizer)
    if trl_template_dir() is not None:
        tok.chat_template = (trl_template_dir() / "gptoss.jinja").read_text(encoding="utf-8")
    elif parser_name == "response_schema":
        pytest.skip("TRL's chat templates are not installed")
    manager = ToolManager([calculator], parser=make_tool_parser(parser_name, tok))
    slow = []
    for name, text in HOSTILE_COMPLETIONS.items():
        with memory_cap():
            t0 = time.monotonic()
            replies = run_sync(manager.run(text))  # parses, then runs (at most max_calls of) the calls
            elapsed = time.monotonic() - t0
        if elapsed > BOUND_S / 6:
            slow.append(f"{name}: {elapsed:.1f}s")
        assert len(replies) <= ToolManager.max_calls and all(len(r["content"]) < 20_000 for r in replies), name
    assert not slow, f"{parser_name} was slow on: {', '.join(slow)}"


def _in_repo_plugins() -> str:
    """Every plugin distribution of this repository that is installed here (comma-separated)."""
    from importlib import metadata
    from pathlib import Path

    names = []
    for pyproject in sorted((Path(__file__).resolve().parents[1] / "plugins").glob("*/*/pyproject.toml")):
        name = pyproject.parent.name
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        names.append(name)
    return ",".join(names)


PLUGINS = _in_repo_plugins()


@pytest.fixture
def rlcore_plugins() -> str:
    return PLUGINS


def _installed_rewards() -> list[str]:
    before = os.environ.get("RLCORE_PLUGINS")
    os.environ["RLCORE_PLUGINS"] = PLUGINS
    try:
        rlcore.reload_plugins()
        return sorted(rlcore.available("reward"))
    finally:
        if before is None:
            os.environ.pop("RLCORE_PLUGINS", None)
        else:
            os.environ["RLCORE_PLUGINS"] = before
        rlcore.reload_plugins()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: rewards that cannot be built without options, and what this test builds them with: rl-plugin-judge's
#: llm_judge with a judge nobody listens on (the hostile text is rendered into its rubric and hashed for its
#: cache; the call then fails at once, a counted None; hostile replies are fuzzed in the plugin's own tests)
REWARD_OPTIONS = {"llm_judge": lambda: {"judge_url": f"http://127.0.0.1:{_closed_port()}", "retries": 0}}


@pytest.mark.parametrize("reward", _installed_rewards())
def test_every_reward_stays_bounded_on_every_hostile_completion(reward: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLCORE_SAMPLE_TIMEOUT", str(SAMPLE_TIMEOUT))
    factory = rlcore.get("reward", reward)
    options = REWARD_OPTIONS[reward]() if reward in REWARD_OPTIONS else {}
    obj = as_reward(reward, factory(**options) if isinstance(factory, type) else factory)
    slow = []
    for name, text in HOSTILE_COMPLETIONS.items():
        # a numeric answer (the GSM8K path of gsm8k_accuracy/cosine) and a LaTeX solution (the
        # math-verify path of math_accuracy) on the row
        trajs = [hostile_trajectory(text, answer="5", solution="\\frac{1}{2}")]
        with memory_cap():
            t0 = time.monotonic()
            columns = run_sync(compute_rewards(RunHooks(obj), trajs))
            elapsed = time.monotonic() - t0
        if elapsed > BOUND_S:
            slow.append(f"{name}: {elapsed:.1f}s")
        for v in columns[reward]:
            assert v is None or math.isfinite(v), f"{reward} on {name} gave {v}"
    assert not slow, f"{reward} was not bounded on: {', '.join(slow)}"


@pytest.mark.parametrize("name", sorted(HOSTILE_COMPLETIONS))
def test_environment_action_parsers_stay_bounded(name: str) -> None:
    """The in-repo environments read actions out of model text too (a rollout stalls just the same)."""
    text = HOSTILE_COMPLETIONS[name]
    parsers = []
    try:
        from rl_plugin_openenv.actions import parse_action

        parsers.append(parse_action)
    except ImportError:
        pass
    try:
        from rl_plugin_gym.actions import DiscreteParser, answer_text, last_int

        parsers += [answer_text, last_int, DiscreteParser(4, names=["LEFT", "DOWN", "RIGHT", "UP"])]
    except ImportError:
        pass
    with memory_cap():
        t0 = time.monotonic()
        for parse in parsers:
            try:
                parse(text)
            except ValueError:
                pass  # refused (e.g. an integer of a million digits): fine, it returned
        elapsed = time.monotonic() - t0
    assert elapsed < BOUND_S, f"{name}: action parsing took {elapsed:.1f}s"
