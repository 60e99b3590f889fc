"""Rollout schedulers: the single-turn base and the multi-turn loop, ms-swift compatible.

A scheduler decides what happens between generations. Its methods carry ms-swift's names and
argument names (``step(infer_request, response_choice, current_turn)`` …, ``run(infer_request,
request_config, **kwargs)``) so a scheduler written for ms-swift — subclass
:class:`MultiTurnScheduler`, override ``step`` and/or ``check_finished``, or ``run`` entirely —
works with an import change. There is one mechanism: the loop in :meth:`RolloutScheduler.run`
calls the scheduler's own methods (Python's method resolution and ``super()`` are the call order).
pluggy serves registration and the observers a run names (``observers``): they see every turn and
may add infos, but never end a trajectory or change its reward (see docs/concepts.md).

Token exactness lives in :mod:`rlcore.rollout.stream`: schedulers edit ``messages`` only, the
engine turns those edits into loss-mask-0 tokens without re-tokenising what was sampled; the
invariant checker (:mod:`rlcore.rollout.invariants`) holds every result to the conversation.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from typing import Any

from ..asyncutil import await_me_maybe
from ..errors import ConfigError
from ..types import Completion, SamplingParams, Trajectory
from .stream import TokenStream
from ..compat.swift.api import (
    ChatCompletionResponse,
    Messages,
    ResponseChoice,
    RolloutOutput,
    as_sampling_params,
    extract_logprobs,
)
from ..compat.swift.v4 import SwiftHelpers

MAX_TURNS_HARD_CAP = 1000

#: the sampler calls of the trajectory whose ``run`` is executing (set per asyncio task by the driver)
SAMPLES: contextvars.ContextVar[list[Completion] | None] = contextvars.ContextVar("rlcore_samples", default=None)

#: uuids whose ``on_trajectory_start`` the driver already ran, seen from inside that trajectory's ``run``
STARTED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("rlcore_started", default=frozenset())


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


class RolloutScheduler(SwiftHelpers):
    """Single-turn rollouts: one completion per trajectory. Base of every scheduler.

    ms-swift 4.x's helper methods (``get_response_token_data``, ``prepare_response_continuation``,
    ``set_assistant_message_token_ids``, ``snapshot_and_materialize_assistant_messages``,
    ``restore_assistant_message_snapshots``, ``append_assistant_completion``, ``engine``) come from
    :class:`~rlcore.compat.swift.v4.SwiftHelpers`.

    Options: ``max_turns`` (1), ``sampling_params``, ``max_total_tokens`` (stop — truncated — once
    prompt + completion reach it), ``tools`` (JSON schemas rendered by the chat template; kept in
    ``self.tool_schemas`` so a subclass may use ``self.tools`` for its own callables, as ms-swift's
    ToolCallScheduler does). Any other keyword option is kept in ``self.options`` (and ``kwargs``
    reads in ms-swift style constructors get it). The driver sets ``sampler``/``tokenizer``/
    ``sampling_params`` when they were not given.
    """

    name = "single_turn"
    default_max_turns = 1
    #: True lets an observer's ``{"done": True}`` from ``on_turn_end`` end a trajectory of this scheduler
    observers_may_stop = False
    #: ms-swift 4.x's template handle (``self._template``); rlcore renders with the tokenizer's chat template
    _template: Any = None

    def __init__(
        self,
        sampler: Any = None,
        max_turns: int | None = None,
        *args: Any,
        tokenizer: Any = None,
        sampling_params: SamplingParams | None = None,
        max_total_tokens: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        **options: Any,
    ) -> None:
        if sampler is None and "infer_engine" in options:  # ms-swift's constructor argument name
            sampler = options.pop("infer_engine")
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.max_turns = int(max_turns) if max_turns is not None else self.default_max_turns
        if self.max_turns < 1:
            raise ConfigError(f"max_turns must be at least 1, got {max_turns}")
        self.sampling_params = sampling_params
        self.max_total_tokens = max_total_tokens
        self.tool_schemas = tools
        self.tools = tools
        self.options = options
        self.observers: Any = None  # the run's RunHooks of named observers, set by the driver
        self._streams: dict[str, TokenStream] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fn = cls.__dict__.get("on_trajectory_start")
        if callable(fn) and not getattr(fn, "_rlcore_once", False):
            cls.on_trajectory_start = _once_per_trajectory(fn)  # type: ignore[method-assign]

    # --- ms-swift compatible attributes -------------------------------------------------------
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

    def tools_for(self, trajectory: Trajectory) -> list[dict[str, Any]] | None:
        """The tool schemas ``trajectory``'s chat template renders: its own
        (``infos["template_tools"]``, set when trajectories of one batch offer different tools, as
        TRL's dict of ``environment_factory`` does) or the scheduler's."""
        own = trajectory.infos.get("template_tools")
        return own if isinstance(own, list) else self.template_tools

    @staticmethod
    def _extract_logprobs_from_choice(response_choice: Any) -> list[float]:
        """ms-swift's helper: the choice's per-token logprobs, ``[]`` when it has none."""
        return extract_logprobs(response_choice)

    # --- lifecycle (override these; sync or async) ----------------------------------------------
    def on_trajectory_start(self, trajectories: list[Trajectory]) -> Any:
        """Once per batch before the first turn (reset environments, seed messages). Replacing a
        trajectory's ``messages`` here is enough: the prompt tokens follow them. Runs once per
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
        if response_choice.finish_reason == "length":
            return True
        return current_turn >= self.max_turns

    def on_trajectory_end(self, trajectory: Trajectory) -> None:
        """Called on every path (ok, truncated, failed, cancelled): close per-trajectory resources."""

    async def close(self) -> None:
        """Release what the scheduler holds (not the sampler: the caller owns it)."""

    # --- the loop -----------------------------------------------------------------------------
    async def run(self, infer_request: Trajectory, request_config: Any = None, **kwargs: Any) -> Trajectory | list[Trajectory]:
        """Run one trajectory to the end: generate, ``on_turn_end``, ``check_finished``, ``step``.

        The scheduler's own methods are called directly, in that order; named observers see each
        turn after ``on_turn_end``."""
        traj = infer_request
        params = as_sampling_params(request_config, self.sampling_params)
        turn = 0
        while traj.status == "running":
            turn += 1
            completion = await self.generate(traj, params)
            choice = ResponseChoice(completion, self.tokenizer)
            traj.num_turns = turn
            if completion.finish_reason == "length":
                traj.status, traj.reason = "truncated", "max_tokens reached"
            snaps = self.snapshot_and_materialize_assistant_messages(traj)  # hooks read text (ms-swift 4.x)
            try:
                done = apply_turn_end(traj, await await_me_maybe(self.on_turn_end(traj, choice, turn)))
                done = await self.observe_turn(traj, choice, turn) or done
                if traj.status == "failed":
                    break
                finished = done or bool(await await_me_maybe(self.check_finished(traj, choice, turn)))
            finally:
                self.restore_assistant_message_snapshots(snaps)
            if traj.status == "failed":
                break
            if finished or turn >= self.max_turns or turn >= MAX_TURNS_HARD_CAP:
                break
            if traj.status == "truncated":  # a scheduler chose to go on after a length stop
                traj.status, traj.reason = "running", None
            out = await await_me_maybe(self.step(traj, choice, turn))
            self.apply_step(traj, out, turn)
            if self.max_total_tokens and len(traj.sample_input_ids) >= self.max_total_tokens:
                traj.status, traj.reason = "truncated", f"max_total_tokens ({self.max_total_tokens}) reached"
        if traj.status == "running":
            traj.status = "ok"
        return traj

    async def observe_turn(self, traj: Trajectory, choice: Any, turn: int) -> bool:
        """Tell the run's observers about a turn; their infos land in ``infos["observers"]``, their
        step rewards in ``infos["observer_rewards"]`` (never in the trained reward). Returns whether
        an observer asked to stop and this scheduler lets observers stop (``observers_may_stop``)."""
        if self.observers is None:
            return False
        results = await self.observers.call_observers("on_turn_end", infer_request=traj, response_choice=choice, current_turn=turn)
        stop = False
        for plugin, r in results.items():
            if not isinstance(r, dict):
                continue
            stop = stop or bool(r.get("done"))
            box = traj.infos.setdefault("observers", {}).setdefault(plugin, {})
            box.update(r.get("infos") or r.get("rollout_infos") or {})
            if r.get("reward") is not None:
                traj.infos.setdefault("observer_rewards", {}).setdefault(plugin, []).append(float(r["reward"]))
        return stop and self.observers_may_stop

    # --- building blocks (also for schedulers that override run) -------------------------------
    def stream(self, trajectory: Trajectory) -> TokenStream:
        """The token stream of ``trajectory`` (created from its prompt on first use)."""
        st = self._streams.get(trajectory.uuid)
        if st is None:
            tok = self._require_tokenizer()
            if not trajectory.turns:
                sync_prompt(tok, trajectory, self.tools_for(trajectory))
            st = TokenStream.start(tok, trajectory, self.tools_for(trajectory))
            st.reader = self.reply_reader(trajectory)
            self._streams[trajectory.uuid] = st
        return st

    def reply_reader(self, trajectory: Trajectory) -> Any:
        """``text -> assistant message with tool_calls`` (or None) for a scheduler whose replies
        may be tool calls: the stream records such a reply in that form where the template
        renders tool calls from the message's fields (see :class:`~rlcore.rollout.tools.ToolScheduler`).
        None here: replies are their text."""
        return None

    def release(self, trajectory: Trajectory) -> None:
        """Forget the per-trajectory stream state (the driver calls this when a trajectory ends)."""
        self._streams.pop(trajectory.uuid, None)

    async def generate(
        self, trajectory: Trajectory, params: SamplingParams | None = None, *, update_messages: bool = True
    ) -> Completion:
        """Sample the next completion from the trajectory's exact token stream and record it."""
        if self.sampler is None:
            raise ConfigError(f"scheduler {type(self).__name__} has no sampler; pass sampler= or run it through run_rollouts")
        st = self.stream(trajectory)
        st.sync(trajectory)
        params = as_sampling_params(params, self.sampling_params) or SamplingParams()
        ids = trajectory.sample_input_ids
        if self.max_total_tokens:
            room = self.max_total_tokens - len(ids)
            if room <= 0:
                raise ConfigError(f"trajectory is already {len(ids)} tokens, max_total_tokens is {self.max_total_tokens}")
            params = params.replace(max_tokens=min(params.max_tokens, room))
        if not trajectory.turns:
            trajectory.policy_version = int(getattr(self.sampler, "policy_version", 0) or 0)
        completion = await self.sampler.generate(ids, params)
        # what the sampler was given: a run override's RolloutOutput is assembled against it
        completion.meta["input_ids"] = ids
        st.record_sample(trajectory, completion, update_messages=update_messages)
        return completion

    def apply_step(self, trajectory: Trajectory, out: Any, turn: int | None = None) -> None:
        """Apply ``step``'s ms-swift-shaped result: messages, optional response tokens, infos."""
        who = f"{type(self).__name__}.step"
        if out is None:
            out = {}
        if isinstance(out, Trajectory):
            out = {"infer_request": out}
        if not isinstance(out, dict):
            raise ConfigError(f"{who} returned {type(out).__name__}; return a dict like {{'infer_request': request}}")
        req = out.get("infer_request")
        if req is not None and req is not trajectory:
            msgs = req.get("messages") if isinstance(req, dict) else getattr(req, "messages", None)
            if msgs is not None:
                trajectory.messages[:] = list(msgs)
        _check_messages(trajectory.messages, who)
        infos = out.get("rollout_infos")
        if infos:
            trajectory.infos.update(infos)
        st = self.stream(trajectory)
        if out.get("response_token_ids") is not None:
            ids = out["response_token_ids"]
            if ids and isinstance(ids[0], (list, tuple)):  # one round given as [[...]]
                ids = [t for r in ids for t in r]
            st.replace_response(trajectory, list(ids), out.get("response_loss_mask"), out.get("rollout_logprobs"))
        st.sync(trajectory)

    def _require_tokenizer(self) -> Any:
        tok = self.tokenizer if self.tokenizer is not None else getattr(self.sampler, "tokenizer", None)
        if tok is None:
            raise ConfigError(f"scheduler {type(self).__name__} has no tokenizer; pass tokenizer= or a sampler that has one")
        self.tokenizer = tok
        return tok


class MultiTurnScheduler(RolloutScheduler):
    """Many turns (``max_turns`` default 4). Subclass and override ``step`` (append the next user
    message to ``infer_request.messages``) and/or ``check_finished`` — or ``run`` entirely."""

    name = "multi_turn"
    default_max_turns = 4


def apply_turn_end(trajectory: Trajectory, result: Any) -> bool:
    """Apply the scheduler's ``on_turn_end`` result: ``done`` ends, ``infos``/``rollout_infos`` merge,
    ``reward`` is a step reward. Returns ``done``."""
    if not isinstance(result, dict):
        return False
    for key in ("infos", "rollout_infos"):
        if result.get(key):
            trajectory.infos.update(result[key])
    if result.get("reward") is not None:
        trajectory.step_rewards.append(float(result["reward"]))
    return bool(result.get("done"))


def sync_prompt(tokenizer: Any, trajectory: Trajectory, tools: list[dict[str, Any]] | None) -> None:
    """Make ``prompt_ids`` follow ``messages`` before the first turn (fix for schedulers that replace
    the messages — ms-swift's GYMScheduler seeds system prompt and first observation — and leave
    the dataset row's prompt tokens). Left-truncated prompts (max_prompt_length) and TRL-style
    untemplated text prompts are kept."""
    from .. import chat_template as tk

    if not trajectory.messages:
        return
    _check_messages(trajectory.messages, "the scheduler")
    from .invariants import prompt_matches

    want = tk.render(tokenizer, trajectory.messages, add_generation_prompt=True, tools=tools)
    have = tk.decode(tokenizer, trajectory.prompt_ids)
    if prompt_matches(tokenizer, trajectory.messages, trajectory.prompt_ids, have, want,
                      truncated=bool(trajectory.infos.get("prompt_truncated"))):
        return
    trajectory.prompt_ids = tk.encode_text(tokenizer, want)
    trajectory.infos["prompt_reencoded"] = True


def _check_messages(messages: Any, who: str) -> None:
    if not isinstance(messages, list):
        raise ConfigError(f"{who} left messages as {type(messages).__name__}; it must be a list of role/content dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ConfigError(f"{who} put {type(m).__name__} {m!r:.60} at messages[{i}]; each message must be a dict with 'role' and 'content'")


def accepts_request_config(run: Any) -> bool:
    """Whether an (overridden) ``run`` takes ms-swift's ``request_config`` (else ``run(request)``)."""
    try:
        params = list(inspect.signature(run).parameters.values())
    except (TypeError, ValueError):
        return True
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]) >= 2


def build_scheduler(factory: Any, sampler: Any = None, tokenizer: Any = None, **options: Any) -> Any:
    """Construct a registered scheduler and attach ``sampler``/``tokenizer`` afterwards.

    The sampler is not passed to the constructor so that schedulers written the ms-swift way —
    ``def __init__(self, infer_engine=None, max_turns=None, *args, **kwargs)`` forwarding
    ``super().__init__(infer_engine, max_turns, *args, **kwargs)`` — work unchanged.
    """
    if sampler is not None and "infer_engine" not in options and _requires(factory, "infer_engine"):
        options["infer_engine"] = sampler  # ms-swift's GYMScheduler takes infer_engine without a default
    scheduler = factory(**options)
    if getattr(scheduler, "sampler", None) is None:
        scheduler.sampler = sampler
    if getattr(scheduler, "tokenizer", None) is None:
        scheduler.tokenizer = tokenizer
    return scheduler


def _requires(factory: Any, name: str) -> bool:
    try:
        p = inspect.signature(factory).parameters.get(name)
    except (TypeError, ValueError):
        return False
    return p is not None and p.default is inspect.Parameter.empty


def scheduler_label(scheduler: Any) -> str:
    """How failure reasons name a scheduler: its registered name and class."""
    cls = type(scheduler).__name__
    name = vars(type(scheduler)).get("name")  # an inherited name ("multi_turn") would mislead
    return f"scheduler {name!r} ({cls})" if name else f"scheduler {cls}"
