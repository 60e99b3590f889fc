"""ms-swift's scheduler base classes, adapted once to rlcore's scheduler contract.

A scheduler written for ms-swift (3.x ``swift.plugin.multi_turn``, 4.x ``swift.rollout``) subclasses
:class:`MultiTurnScheduler` or :class:`RolloutScheduler` from here (``from rlcore import
MultiTurnScheduler``), overrides ``step`` and/or ``check_finished`` — or ``run`` entirely — and runs
with its imports changed. These classes are rlcore's :class:`rlcore.rollout.RolloutScheduler` plus
what ms-swift code reaches for, and nothing else carries it:

* ms-swift's names: the hooks take ``(infer_request, response_choice, current_turn)``,
  ``run(infer_request, request_config)`` takes ms-swift's ``RequestConfig`` (or a dict), the
  constructor takes ``infer_engine`` and ms-swift's forwarded ``*args``;
* ``self.infer_engine`` (and 4.x's ``self.engine``) for a ``run`` override:
  ``await self.infer_engine.infer_async(request, request_config)`` samples from the request's
  token-exact stream; the samples are recorded so the ``RolloutOutput`` it returns is assembled
  against them;
* ``self.tools`` may be the scheduler's own (a dict of callables, as ms-swift's ToolCallScheduler
  has); the template renders ``tool_schemas``;
* 4.x: the helper methods of :class:`~rlcore.compat.swift.v4.SwiftHelpers`, awaitable results of
  the base ``on_trajectory_start``/``on_turn_end`` (4.x's hooks are ``async def`` and subclasses
  ``await super()...``), and ``on_trajectory_start`` running once per trajectory: 4.x's base ``run``
  starts its own request, and a ``run`` copied from it must not reset an environment twice.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from ...rollout import scheduler as _rlcore
from ...rollout.scheduler import SAMPLES, STARTED, as_sampling_params
from ...types import Trajectory
from .api import ChatCompletionResponse, ResponseChoice, extract_logprobs
from .v4 import SwiftHelpers


class _Noop:
    """What the base ``on_trajectory_start`` returns: nothing, and awaitable — ms-swift 4.x's hooks
    are ``async def``, so a 4.x subclass writes ``await super().on_trajectory_start(requests)``."""

    def __await__(self) -> Any:
        return iter(())


class _AwaitableDict(dict):  # type: ignore[type-arg]
    """A dict that is also awaitable (to itself): the base ``on_turn_end`` result, usable by rlcore's
    sync callers and by ms-swift 4.x's ``await super().on_turn_end(...)``."""

    def __await__(self) -> Any:
        return self
        yield  # pragma: no cover - makes this a generator


def _already_started(trajectories: Any) -> bool:
    """Whether the driver already started every one of ``trajectories`` in this rollout."""
    started = STARTED.get()
    return bool(started) and bool(trajectories) and all(getattr(t, "uuid", None) in started for t in trajectories)


def _once_per_trajectory(fn: Any) -> Any:
    """Wrap a subclass's ``on_trajectory_start`` so that a call from inside ``run`` for trajectories
    the driver already started is a no-op: ms-swift 4.x's ``MultiTurnScheduler.run`` starts its own
    request, and a ``run`` copied from it must not reset an environment twice."""

    # the check lives at module level: a subclass pickled by value (a Ray worker's copy of a
    # scheduler defined in a script) then pickles it by reference, not the ContextVar it reads
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def wrapper_async(self: Any, trajectories: Any, *args: Any, **kwargs: Any) -> Any:
            if _already_started(trajectories):
                return None
            return await fn(self, trajectories, *args, **kwargs)

        wrapper: Any = wrapper_async
    else:
        @functools.wraps(fn)
        def wrapper_sync(self: Any, trajectories: Any, *args: Any, **kwargs: Any) -> Any:
            if _already_started(trajectories):
                return _Noop()
            return fn(self, trajectories, *args, **kwargs)

        wrapper = wrapper_sync
    wrapper._rlcore_once = True
    return wrapper


class _InferEngine:
    """ms-swift's ``self.infer_engine`` for schedulers that override ``run``: samples the next
    completion of a request from its (token-exact) stream; the caller appends the message.

    A trailing ``{"role": "assistant", "content": None}`` (ms-swift's "continue the previous
    assistant message" marker) is dropped before sampling."""

    def __init__(self, scheduler: "RolloutScheduler") -> None:
        self.scheduler = scheduler

    async def infer_async(self, infer_request: Trajectory, request_config: Any = None, **_: Any) -> ChatCompletionResponse:
        msgs = infer_request.messages
        while msgs and msgs[-1].get("role") == "assistant" and msgs[-1].get("content") is None:
            msgs.pop()
        params = as_sampling_params(request_config, self.scheduler.sampling_params)
        completion = await self.scheduler.generate(infer_request, params, update_messages=False)
        log = SAMPLES.get()
        if log is not None:
            log.append(completion)
        return ChatCompletionResponse([ResponseChoice(completion, self.scheduler.tokenizer)], list(infer_request.prompt_ids))

    def __getattr__(self, name: str) -> Any:  # ms-swift code may reach engine attributes (tokenizer …)
        if name.startswith("__"):
            raise AttributeError(name)
        if name in ("tokenizer", "default_template", "template"):
            if name == "tokenizer":
                return self.scheduler.tokenizer
            raise AttributeError(f"rlcore's infer_engine has no {name!r} (ms-swift's template object); use self.tokenizer")
        return getattr(self.scheduler.sampler, name)


class RolloutScheduler(SwiftHelpers, _rlcore.RolloutScheduler):
    """ms-swift's ``RolloutScheduler`` (single turn; base of :class:`MultiTurnScheduler`), on rlcore's.

    ms-swift 4.x's helper methods (``get_response_token_data``, ``prepare_response_continuation``,
    ``set_assistant_message_token_ids``, ``snapshot_and_materialize_assistant_messages``,
    ``restore_assistant_message_snapshots``, ``append_assistant_completion``, ``engine``) come from
    :class:`~rlcore.compat.swift.v4.SwiftHelpers`.

    Options as :class:`rlcore.rollout.RolloutScheduler`'s; ``infer_engine`` is ms-swift's name for
    the sampler, and ``tools`` (JSON schemas rendered by the chat template) is kept in
    ``self.tool_schemas`` so a subclass may use ``self.tools`` for its own callables, as ms-swift's
    ToolCallScheduler does. Extra positional arguments (ms-swift's ``*args`` forwarding) are accepted
    and ignored; any other keyword option is kept in ``self.options`` (``kwargs`` reads in ms-swift
    style constructors get it).
    """

    name = "single_turn"
    #: ms-swift 4.x's template handle (``self._template``); rlcore renders with the tokenizer's chat template
    _template: Any = None

    def __init__(self, sampler: Any = None, max_turns: int | None = None, *args: Any, tools: list[dict[str, Any]] | None = None,
                 **options: Any) -> None:
        if sampler is None and "infer_engine" in options:  # ms-swift's constructor argument name
            sampler = options.pop("infer_engine")
        super().__init__(sampler, max_turns, tools=tools, **options)
        self.tool_schemas = tools

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fn = cls.__dict__.get("on_trajectory_start")
        if callable(fn) and not getattr(fn, "_rlcore_once", False):
            cls.on_trajectory_start = _once_per_trajectory(fn)  # type: ignore[method-assign]

    @property
    def infer_engine(self) -> _InferEngine:
        """ms-swift's engine handle: ``await self.infer_engine.infer_async(request, request_config)``."""
        return _InferEngine(self)

    @infer_engine.setter
    def infer_engine(self, sampler: Any) -> None:
        self.sampler = sampler

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """The JSON tool schemas the chat template renders: ``tool_schemas``, else ``self.tools`` when
        it holds schemas (a subclass's dict of callables — ms-swift's ToolCallScheduler — is its own)."""
        if self.tool_schemas is not None:
            return self.tool_schemas
        tools = getattr(self, "tools", None)
        if isinstance(tools, list) and tools and all(isinstance(t, dict) for t in tools):
            return tools
        return None

    @staticmethod
    def _extract_logprobs_from_choice(response_choice: Any) -> list[float]:
        """ms-swift's helper: the choice's per-token logprobs, ``[]`` when it has none."""
        return extract_logprobs(response_choice)

    # --- ms-swift's hook signatures ------------------------------------------------------------
    def on_trajectory_start(self, trajectories: list[Trajectory]) -> Any:
        """Once per batch before the first turn (reset environments, seed messages). Runs once per
        trajectory: a call from inside ``run`` (ms-swift 4.x's base ``run`` makes one) for a
        trajectory the driver started is skipped."""
        return _Noop()

    def on_turn_end(self, infer_request: Trajectory, response_choice: Any, current_turn: int) -> dict[str, Any] | None:
        """After each assistant turn: ``{"done": bool, "reward": float, "infos": {...}}`` (ms-swift's
        ``rollout_infos`` is accepted for ``infos``) or None. ``done`` True ends the trajectory;
        False leaves the decision to ``check_finished`` (in ms-swift 4.x a ``done`` key replaces it)."""
        return _AwaitableDict()

    def step(self, infer_request: Trajectory, response_choice: Any, current_turn: int) -> dict[str, Any]:
        """Build the next turn; the default changes nothing, so the model continues its message."""
        return {"infer_request": infer_request}

    def check_finished(self, infer_request: Trajectory, response_choice: Any, current_turn: int) -> bool:
        """Stop on a length-truncated completion or once ``max_turns`` turns are done."""
        return super().check_finished(infer_request, response_choice, current_turn)

    async def run(self, infer_request: Trajectory, request_config: Any = None, **kwargs: Any) -> Trajectory | list[Trajectory]:
        """Run one trajectory to the end (rlcore's loop); ``request_config`` may be ms-swift's."""
        return await super().run(infer_request, request_config, **kwargs)


class MultiTurnScheduler(RolloutScheduler):
    """ms-swift's ``MultiTurnScheduler`` (``max_turns`` default 4). Subclass and override ``step``
    (append the next user message to ``infer_request.messages``) and/or ``check_finished`` — or
    ``run`` entirely."""

    name = "multi_turn"
    default_max_turns = 4
