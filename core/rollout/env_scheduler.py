"""EnvScheduler: the shared base of environment-driven schedulers (gym_scheduler, openenv_scheduler).

One environment per trajectory. Reset seeds the conversation with the first observation; each
assistant turn is parsed into an action and stepped; the next observation becomes the next user
message (the engine appends its tokens with loss_mask 0). Sync environment methods run in worker
threads and every env call has a timeout, so one slow or hung environment never stalls the others;
an env that raises or times out fails only its own trajectory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import warnings
from typing import Any, Mapping

from ..asyncutil import await_me_maybe
from ..envs import Env, EnvStep
from ..errors import ConfigError, EnvError, one_line
from ..types import Completion, SamplingParams, Trajectory
from .options import json_object
from .scheduler import MultiTurnScheduler, ResponseChoice
from ..chat_template import encode_prompt


class EnvScheduler(MultiTurnScheduler):
    """Plays one registered env per trajectory; subclasses may override :meth:`make_env` (build envs
    their own way), :meth:`env_factory` (resolve more names), :meth:`parse_action` /
    :meth:`format_observation`.

    Options: ``env`` (the registered env a row without ``env_config.name`` plays: any package's,
    `rlcore components env`), ``env_kwargs`` (options for every env of the run; a row's
    ``env_config`` overrides them), ``max_turns`` (4), ``max_env_calls`` (env calls — reset, step,
    close — in flight at once, and the width of the thread pool sync envs run on, 64; rlcore 0.1
    called it ``max_concurrent_envs``, still accepted with a warning),
    ``env_timeout`` (seconds per reset/step/close, 60), ``stop`` (strings that end an assistant turn,
    added to the sampling params' own: an environment whose action is one word can end the turn at
    the first whitespace), ``stop_on_truncation`` (end the episode when a reply hits ``max_tokens``;
    default True — with False the cut reply is still sent to the environment and the episode goes on).
    """

    name = "env_scheduler"

    def __init__(
        self,
        sampler: Any = None,
        *,
        env: str | None = None,
        env_kwargs: Mapping[str, Any] | str | None = None,
        max_env_calls: int = 64,
        max_concurrent_envs: int | None = None,
        env_timeout: float | None = 60.0,
        stop: list[str] | str | None = None,
        stop_on_truncation: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(sampler, **kwargs)
        self.stop = [stop] if isinstance(stop, str) else [str(s) for s in (stop or []) if s]
        self.stop_on_truncation = bool(stop_on_truncation)
        if max_concurrent_envs is not None:  # rlcore 0.1's name (it meant something else in OpenEnv)
            warnings.warn("max_concurrent_envs is deprecated for env schedulers: use max_env_calls (env calls in "
                          "flight at once)", FutureWarning, stacklevel=3)
            max_env_calls = max_concurrent_envs
        self.max_env_calls = max(1, int(max_env_calls))
        self.env_timeout = float(env_timeout) if env_timeout else None
        self._envs: dict[str, Any] = {}
        self._pending: dict[str, str] = {}
        self._env_sem: asyncio.Semaphore | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.env = env
        self.env_kwargs = json_object(env_kwargs, "env_kwargs")  # from the command line: a JSON string
        if env:  # a typo in --env or in an option of its env is one line now, not a batch of failed trajectories
            factory, implied = self.env_factory(str(env))
            _check_options(str(env), factory, {**implied, **self.env_kwargs})

    @property
    def max_concurrent_envs(self) -> int:
        """rlcore 0.1's name of :attr:`max_env_calls` (read-only)."""
        return self.max_env_calls

    # --- what subclasses may override ----------------------------------------------------------------
    @staticmethod
    def env_factory(name: str) -> tuple[Any, dict[str, Any]]:
        """The factory of env ``name`` and the options its name implies: the registered env of that
        name (this or any installed package's). Subclasses may resolve more names (gym_scheduler:
        gymnasium ids). Raises :class:`UnknownComponentError` naming what is registered.

        A static method, so a run checks ``--env`` before any model loads (:func:`chosen_env`); an
        override that needs the instance may be a plain method, and is then checked when the
        scheduler is built instead."""
        from ..plugins import get

        return get("env", name), {}

    def make_env(self, trajectory: Trajectory) -> Env:
        """A fresh environment for ``trajectory``: the env its row's ``env_config.name`` or the run's
        ``env`` names, with options ``env_kwargs`` < the row's ``env_config`` keys < its
        ``env_config.kwargs`` dict (``name``/``seed``/``kwargs`` themselves are not options)."""
        config = row_env_config(trajectory)
        name = config.get("name") or self.env
        if not name:
            raise ConfigError(
                f"{self.name} needs an env: give the run --env NAME (`rlcore components env` lists them) "
                "or each row an env_config with a name"
            )
        factory, implied = self.env_factory(str(name))
        return build_env(str(name), factory, {**implied, **env_options(config, self.env_kwargs)})

    def parse_action(self, text: str) -> Any:
        """The action the model's reply ``text`` stands for (default: the text, stripped)."""
        return text.strip()

    def format_observation(self, observation: Any) -> str:
        """The user-message text for an observation (default: ``str``)."""
        return observation if isinstance(observation, str) else str(observation)

    def seed_conversation(self, trajectory: Trajectory, observation: Any, system_message: str | None) -> None:
        """Messages = [system] + user(first observation); prompt ids re-encoded from them.

        The row's own system message is kept when the environment gives none.
        """
        messages: list[dict[str, Any]] = []
        if system_message:
            messages.append({"role": "system", "content": str(system_message)})
        elif trajectory.messages and trajectory.messages[0].get("role") == "system":
            messages.append(dict(trajectory.messages[0]))
        messages.append({"role": "user", "content": self.format_observation(observation)})
        trajectory.messages[:] = messages
        trajectory.prompt_ids = encode_prompt(self._require_tokenizer(), messages, tools=self.template_tools)

    # --- lifecycle -------------------------------------------------------------------------------
    async def generate(self, trajectory: Trajectory, params: SamplingParams | None = None, **kwargs: Any) -> Completion:
        """The base generate, with this scheduler's ``stop`` strings added to the sampling params."""
        if self.stop:
            params = params or self.sampling_params or SamplingParams()
            params = params.replace(stop=list(dict.fromkeys([*params.stop, *self.stop])))
        return await super().generate(trajectory, params, **kwargs)

    def check_finished(self, trajectory: Trajectory, choice: ResponseChoice, turn: int) -> bool:
        """Default rules; with ``stop_on_truncation=False`` a reply cut by ``max_tokens`` is still sent
        to the environment and the episode goes on (the env judges the partial action)."""
        if choice.finish_reason == "length" and not self.stop_on_truncation:
            finished = turn >= self.max_turns
        else:
            finished = super().check_finished(trajectory, choice, turn)
        if finished:  # what ended the episode, for the run's metrics (the env's done never gets here)
            cut = choice.finish_reason == "length" and self.stop_on_truncation
            trajectory.infos["ended_by"] = "length" if cut else "max_turns"
        return finished

    async def on_trajectory_start(self, trajectories: list[Trajectory]) -> None:
        await asyncio.gather(*(self._reset_one(t) for t in trajectories if t.status == "running"))

    async def _reset_one(self, trajectory: Trajectory) -> None:
        try:
            env = await await_me_maybe(self.make_env(trajectory))
            self._envs[trajectory.uuid] = env
            out = await self._env_call("reset", env.reset, trajectory)
            observation, info, system = _reset_result(out)
        except Exception as exc:  # noqa: BLE001 - fails this trajectory only
            trajectory.fail(self.failure_reason("reset", exc))
            return
        self.seed_conversation(trajectory, observation, system)
        if info:
            trajectory.infos["reset_info"] = info

    async def on_turn_end(self, trajectory: Trajectory, choice: ResponseChoice, turn: int) -> dict[str, Any] | None:
        env = self._envs.get(trajectory.uuid)
        if env is None:
            trajectory.fail("no environment for this trajectory (reset did not run)")
            return {"done": True}
        try:
            action = self.parse_action(choice.message.content)
            res = _step_result(await self._env_call("step", env.step, action))
        except Exception as exc:  # noqa: BLE001
            trajectory.fail(self.failure_reason("step", exc))
            return {"done": True}
        self._pending[trajectory.uuid] = self.format_observation(res.observation)
        infos: dict[str, Any] = {"env_steps": turn, "env_done": bool(res.done)}
        if res.info:
            infos["env_info"] = res.info
        return {"done": bool(res.done), "reward": float(res.reward), "infos": infos}

    def step(self, trajectory: Trajectory, choice: ResponseChoice, turn: int) -> dict[str, Any]:
        obs = self._pending.pop(trajectory.uuid, None)
        if obs is not None:
            trajectory.messages.append({"role": "user", "content": obs})
        return {"infer_request": trajectory}

    async def on_trajectory_end(self, trajectory: Trajectory) -> None:
        self._pending.pop(trajectory.uuid, None)
        env = self._envs.pop(trajectory.uuid, None)
        if env is not None and hasattr(env, "close"):
            await self._env_call("close", env.close)

    async def close(self) -> None:
        for uuid in list(self._envs):
            env = self._envs.pop(uuid)
            try:
                await self._env_call("close", env.close)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    # --- helpers ---------------------------------------------------------------------------------
    #: whether a failure reason names an EnvError's type (False: its message says what broke)
    reason_names_env_errors: bool = True

    def failure_reason(self, what: str, exc: BaseException) -> str:
        """The trajectory's failure reason when env call ``what`` raised ``exc`` or timed out."""
        return env_failure_reason(what, exc, self.env_timeout, name_env_errors=self.reason_names_env_errors)

    async def _env_call(self, what: str, fn: Any, *args: Any) -> Any:
        if self._env_sem is None:
            self._env_sem = asyncio.Semaphore(self.max_env_calls)
        async with self._env_sem:
            coro = self._in_thread_if_sync(fn, *args)
            return await (asyncio.wait_for(coro, self.env_timeout) if self.env_timeout else coro)

    async def _in_thread_if_sync(self, fn: Any, *args: Any) -> Any:
        """Like ``asyncio.to_thread``, but on a pool as wide as ``max_env_calls``: the default
        executor has ``cpu_count + 4`` threads, so 64 blocking 100 ms steps would run in waves."""
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(self.max_env_calls, thread_name_prefix="rlcore-env")
        ctx = contextvars.copy_context()
        result = await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(ctx.run, fn, *args))
        return await await_me_maybe(result)


def _reset_result(out: Any) -> tuple[Any, dict[str, Any], str | None]:
    if isinstance(out, tuple):
        if len(out) == 3:
            return out[0], dict(out[1] or {}), out[2]
        if len(out) == 2:
            return out[0], dict(out[1] or {}), None
    return out, {}, None


def _step_result(out: Any) -> EnvStep:
    if isinstance(out, EnvStep):
        return out
    if isinstance(out, tuple) and len(out) == 4:
        return EnvStep(out[0], float(out[1] or 0.0), bool(out[2]), dict(out[3] or {}))
    if isinstance(out, tuple) and len(out) == 5:  # gymnasium: obs, reward, terminated, truncated, info
        return EnvStep(out[0], float(out[1] or 0.0), bool(out[2]) or bool(out[3]), dict(out[4] or {}))
    raise EnvError(f"env.step returned {type(out).__name__}; return (observation, reward, done, info) or EnvStep")


def env_failure_reason(what: str, exc: BaseException, timeout: float | None, *, name_env_errors: bool = True) -> str:
    """One line for ``trajectory.reason`` when an env call (``what``: reset, step …) raised or timed
    out: ``env step failed: KeyError: 'x'``. With ``name_env_errors=False`` an :class:`EnvError`'s
    message stands alone (for clients whose EnvErrors already say what broke: "server closed the
    session …"). Every env scheduler uses this, so failure reasons group the same across them."""
    if isinstance(exc, asyncio.TimeoutError):
        return f"env {what} timed out after {timeout:g}s"
    if isinstance(exc, EnvError) and not name_env_errors:
        lines = str(exc).strip().splitlines()
        return f"env {what} failed: {lines[0] if lines else type(exc).__name__}"
    return f"env {what} failed: {one_line(exc)}"


# --- registered envs ---------------------------------------------------------------------------------
#: env_config keys that pick the env and its episode, not constructor options
_ROW_ONLY = ("name", "seed", "kwargs")


def row_env_config(request: Any) -> dict[str, Any]:
    """The row's ``env_config`` dict (empty when the row has none)."""
    data = getattr(request, "data", None) or getattr(request, "data_dict", None) or {}
    cfg = data.get("env_config") if isinstance(data, dict) else None
    return dict(cfg) if isinstance(cfg, dict) else {}


def env_options(config: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The constructor options for one trajectory's env: defaults < row keys < row ``kwargs``."""
    options = dict(defaults or {})
    options.update({k: v for k, v in config.items() if k not in _ROW_ONLY})
    extra = config.get("kwargs")
    if isinstance(extra, Mapping):
        options.update(extra)
    return options


def registered_env(name: str) -> Any:
    """The factory registered as env ``name``, or ``None``."""
    from ..errors import UnknownComponentError
    from ..plugins import get

    try:
        return get("env", name)
    except UnknownComponentError:
        return None


def chosen_env(scheduler_factory: Any, options: Mapping[str, Any]) -> tuple[str, Any] | None:
    """(name, factory) of the env a run's env scheduler is told to play (``env`` among its options),
    so that env's own options can be routed to it; ``None`` otherwise.

    The name resolves the way the scheduler resolves it (its static :meth:`EnvScheduler.env_factory`,
    e.g. gymnasium ids for gym_scheduler), so a name it cannot resolve is one line here, before
    any model loads. A scheduler whose ``env_factory`` needs its instance is asked only for
    registered names; the rest is checked when it is built."""
    name = options.get("env")
    if not (isinstance(name, str) and inspect.isclass(scheduler_factory) and issubclass(scheduler_factory, EnvScheduler)):
        return None
    if isinstance(inspect.getattr_static(scheduler_factory, "env_factory"), (staticmethod, classmethod)):
        factory, _implied = scheduler_factory.env_factory(name)
        return name, factory
    factory = registered_env(name)
    return None if factory is None else (name, factory)


def build_env(name: str, factory: Any, options: Mapping[str, Any]) -> Env:
    """``factory(**options)`` after checking the options (an unknown one is one line naming what the
    env takes, not a TypeError); the instance is labelled ``name`` unless it names itself."""
    _check_options(name, factory, options)
    env = factory(**options)
    if not getattr(env, "name", None) or getattr(env, "name", None) == "env":
        env.name = name
    return env


def _check_options(name: str, factory: Any, options: Mapping[str, Any]) -> None:
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    params = sig.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    allowed = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(
            f"env {name!r} does not take option(s) {', '.join(unknown)}; it takes: {', '.join(sorted(allowed)) or 'none'}"
        )
