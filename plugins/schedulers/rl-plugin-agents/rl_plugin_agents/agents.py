"""Running an agent against its session: a Python callable, or a command in a process of its own.

* A callable (``agent="my_pkg.agent:run"`` or the function itself) is called as
  ``agent(client, row)``: an ``async def`` gets an ``openai.AsyncOpenAI`` bound to the session
  (its ``base_url`` and API key), a plain function runs in a worker thread with an
  ``openai.OpenAI``. It returns the reward (a number), a dict (``reward`` plus anything else, kept
  in ``infos["agent"]``), or None (rewards come from the run's reward functions).
* A command (``agent_cmd="python my_agent.py"``) runs with ``OPENAI_BASE_URL``,
  ``OPENAI_API_KEY`` (and ``OPENAI_MODEL``) in its environment and the row as JSON on stdin, in its
  own process group (``start_new_session``); its last non-empty stdout line is JSON: a number or an
  object like the callable's dict. At the deadline, or when the trajectory is cancelled, the
  whole group is killed.

Whatever goes wrong — an exception, a non-zero exit, unreadable output, the deadline — is an
:class:`AgentFailed` with one line saying what, and fails only that trajectory.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import math
import os
import shlex
import signal
import sys
from typing import Any, Callable

from rlcore.errors import ConfigError, one_line

#: stdout and stderr kept from a command agent (the rest is dropped; the last line is the result)
MAX_OUTPUT_BYTES = 1 << 20


class AgentFailed(Exception):
    """The agent did not finish its episode (the reason is the trajectory's)."""


def load_agent(spec: Any) -> Callable[..., Any]:
    """``"module:function"`` (the working directory importable, as ``uvicorn app:app`` does) or a callable."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(f"agent {spec!r} must be 'module:function' (an importable module, e.g. my_pkg.agent:run) or a callable")
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"agent {spec!r}: cannot import {module_name!r} ({exc}); run from the folder that holds it "
                          "or install it") from None
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
    if not callable(fn):
        raise ConfigError(f"agent {spec!r}: {module_name} has no callable {attr!r}")
    return fn


def split_command(cmd: Any) -> list[str]:
    if isinstance(cmd, (list, tuple)) and cmd and all(isinstance(c, str) for c in cmd):
        return list(cmd)
    if isinstance(cmd, str) and cmd.strip():
        return shlex.split(cmd)
    raise ConfigError(f"agent_cmd {cmd!r} must be a command line (e.g. 'python my_agent.py') or a list of arguments")


def read_result(value: Any, who: str) -> tuple[float | None, dict[str, Any]]:
    """``(reward, extra infos)`` from what an agent returned."""
    if value is None:
        return None, {}
    if isinstance(value, bool) or isinstance(value, (int, float)):
        reward = float(value)
        extra: dict[str, Any] = {}
    elif isinstance(value, dict):
        extra = {k: v for k, v in value.items() if k != "reward"}
        raw = value.get("reward")
        if raw is not None and (isinstance(raw, bool) or not isinstance(raw, (int, float))):
            raise AgentFailed(f"{who} returned reward {raw!r}; return a number (or null)")
        reward = None if raw is None else float(raw)
    else:
        raise AgentFailed(f"{who} returned {type(value).__name__} {str(value)[:80]!r}; return a number, a dict with "
                          "'reward', or None")
    if reward is not None and not math.isfinite(reward):
        raise AgentFailed(f"{who} returned reward {reward}; a reward must be finite")
    return reward, extra


async def run_callable(agent: Callable[..., Any], base_url: str, key: str, row: dict[str, Any],
                       timeout: float) -> Any:
    """``agent(client, row)`` with a client bound to the session; its return value."""
    import openai

    is_async = inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(getattr(agent, "__call__", None))
    # the endpoint is plain HTTP on 127.0.0.1: no TLS context to build (loading the CA bundle costs
    # ~0.2 s a client), and no proxy from the environment in the way
    if is_async:
        client: Any = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout,
                                         http_client=openai.DefaultAsyncHttpxClient(verify=False, trust_env=False))
        try:
            return await agent(client, row)
        finally:
            await client.close()
    sync_client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout,
                                http_client=openai.DefaultHttpxClient(verify=False, trust_env=False))
    try:
        result = await asyncio.to_thread(agent, sync_client, row)
        if inspect.isawaitable(result):
            result = await result
        return result
    finally:
        sync_client.close()


async def run_command(argv: list[str], base_url: str, key: str, model: str, row: dict[str, Any],
                      timeout: float, cwd: str | None = None) -> Any:
    """Run the command agent to its end (or kill its process group at ``timeout``); the JSON of
    its last stdout line."""
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key, "OPENAI_MODEL": model}
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env, cwd=cwd, start_new_session=True)
    except OSError as exc:
        raise AgentFailed(f"agent command {shlex.join(argv)[:120]!r} could not start: {exc.strerror or exc}") from None
    try:
        out, err = await asyncio.wait_for(_communicate(proc, json.dumps(row, ensure_ascii=False, default=str).encode()), timeout)
    except asyncio.TimeoutError:
        _kill_group(proc)
        await proc.wait()
        raise AgentFailed(f"the agent command did not finish within {timeout:g} s (its process group was killed)") from None
    except BaseException:
        _kill_group(proc)
        raise
    _kill_group(proc)  # anything it left running in its group goes with it
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise AgentFailed(f"the agent command exited with status {proc.returncode}: {tail[0][:300]}")
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
    if not lines:
        raise AgentFailed("the agent command printed nothing; its last stdout line must be JSON (the reward)")
    try:
        return json.loads(lines[-1])
    except ValueError:
        raise AgentFailed(f"the agent command's last stdout line is not JSON: {lines[-1][:120]!r}") from None


async def _communicate(proc: Any, data: bytes) -> tuple[bytes, bytes]:
    async def read(stream: Any) -> bytes:
        kept = bytearray()
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return bytes(kept)
            kept.extend(chunk)
            if len(kept) > MAX_OUTPUT_BYTES:
                del kept[:len(kept) - MAX_OUTPUT_BYTES]

    async def write() -> None:
        try:
            proc.stdin.write(data)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            proc.stdin.close()

    _, out, err = await asyncio.gather(write(), read(proc.stdout), read(proc.stderr))
    await proc.wait()
    return out, err


def _kill_group(proc: Any) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def failure(exc: BaseException, who: str) -> str:
    """The trajectory's reason for an agent that raised."""
    if isinstance(exc, AgentFailed):
        return str(exc)
    return f"{who} raised {one_line(exc)}"
