"""Rollout schedulers: the single-turn base and the multi-turn loop, ms-swift compatible.

A scheduler decides what happens between generations. Its lifecycle methods carry ms-swift's
names and argument names (``step(infer_request, response_choice, current_turn)`` …) so a scheduler
written for ms-swift — subclass :class:`MultiTurnScheduler`, override ``step`` and/or
``check_finished``, or ``run`` entirely — works unchanged. The engine registers those methods as
hook implementations (through :class:`SchedulerHooks`) in the run's :class:`rlcore.RunHooks`, so
observer plugins see the same lifecycle and ``on_turn_end`` results of several plugins merge.

Token exactness lives in :mod:`rlcore.rollout.stream`: schedulers edit ``messages`` only, the
engine turns those edits into loss-mask-0 tokens without re-tokenising what was sampled.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..asyncutil import await_me_maybe
from ..errors import ConfigError
from ..hookspecs import hookimpl
from ..types import Completion, SamplingParams, Trajectory
from .stream import TokenStream

MAX_TURNS_HARD_CAP = 1000


@attrs.define
class RolloutOutput:
    """ms-swift's ``RolloutOutput`` shape, accepted from an overridden ``run``.

    ``response_token_ids`` / ``response_loss_mask`` / ``rollout_logprobs`` are per-round lists
    (or flat lists) of the tokens after the prompt; ``messages`` the final conversation.
    """

    response: Any = None
    messages: list[dict[str, Any]] | None = None
    response_token_ids: list[Any] = attrs.field(factory=list)
    response_loss_mask: list[Any] = attrs.field(factory=list)
    rollout_logprobs: list[Any] = attrs.field(factory=list)
    rollout_infos: dict[str, Any] = attrs.field(factory=dict)


@attrs.define
class _Choices:
    """What ``infer_engine.infer_async`` returns: ms-swift's response with ``.choices[0]``."""

    choices: list[Completion]


class _InferEngine:
    """ms-swift's ``self.infer_engine`` for schedulers that override ``run``: samples the next
    completion of a request from its (token-exact) stream; the caller appends the message."""

    def __init__(self, scheduler: "RolloutScheduler") -> None:
        self.scheduler = scheduler

    async def infer_async(self, infer_request: Trajectory, request_config: Any = None, **_: Any) -> _Choices:
        params = request_config if isinstance(request_config, SamplingParams) else None
        completion = await self.scheduler.generate(infer_request, params, update_messages=False)
        return _Choices([completion])


class RolloutScheduler:
    """Single-turn rollouts: one completion per trajectory. Base of every scheduler.

    Options: ``max_turns`` (1), ``sampling_params``, ``max_total_tokens`` (stop — truncated — once
    prompt + completion reach it), ``tools`` (JSON schemas rendered by the chat template).
    The driver sets ``sampler``/``tokenizer``/``sampling_params`` when they were not given.
    """

    name = "single_turn"
    default_max_turns = 1

    def __init__(
        self,
        sampler: Any = None,
        max_turns: int | None = None,
        *,
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
        self.tools = tools
        self.options = options
        self.hooks: Any = None  # the run's RunHooks, set by the driver
        self._streams: dict[str, TokenStream] = {}

    # --- ms-swift compatible attributes -------------------------------------------------------
    @property
    def infer_engine(self) -> _InferEngine:
        """ms-swift's engine handle: ``await self.infer_engine.infer_async(request)``."""
        return _InferEngine(self)

    @infer_engine.setter
    def infer_engine(self, sampler: Any) -> None:
        self.sampler = sampler

    # --- lifecycle (override these; sync or async) ----------------------------------------------
    def on_trajectory_start(self, trajectories: list[Trajectory]) -> None:
        """Once per batch before the first turn (reset environments, seed messages)."""

    def on_turn_end(self, infer_request: Trajectory, response_choice: Completion, current_turn: int) -> dict[str, Any] | None:
        """After each assistant turn: ``{"done": bool, "reward": float, "infos": {...}}`` or None."""
        return None

    def step(self, infer_request: Trajectory, response_choice: Completion, current_turn: int) -> dict[str, Any]:
        """Build the next turn; the default changes nothing, so the model continues its message."""
        return {"infer_request": infer_request}

    def check_finished(self, infer_request: Trajectory, response_choice: Completion, current_turn: int) -> bool:
        """Stop on a length-truncated completion or once ``max_turns`` turns are done."""
        if response_choice.finish_reason == "length":
            return True
        return current_turn >= self.max_turns

    def on_trajectory_end(self, trajectory: Trajectory) -> None:
        """Called on every path (ok, truncated, failed, cancelled): close per-trajectory resources."""

    async def close(self) -> None:
        """Release what the scheduler holds (not the sampler: the caller owns it)."""

    # --- the loop -----------------------------------------------------------------------------
    async def run(self, infer_request: Trajectory) -> Trajectory | list[Trajectory]:
        """Run one trajectory to the end: generate, ``on_turn_end``, ``check_finished``, ``step``."""
        traj = infer_request
        hooks = self._hooks()
        turn = 0
        while traj.status == "running":
            turn += 1
            completion = await self.generate(traj)
            traj.num_turns = turn
            if completion.finish_reason == "length":
                traj.status, traj.reason = "truncated", "max_tokens reached"
            results = await hooks.call_all("on_turn_end", trajectory=traj, completion=completion, turn=turn)
            done = merge_turn_results(traj, results)
            if traj.status == "failed":
                break
            finished = done or bool(await hooks.call_first("check_finished", trajectory=traj, completion=completion, turn=turn))
            if traj.status == "failed":
                break
            if finished or turn >= MAX_TURNS_HARD_CAP:
                break
            if traj.status == "truncated":  # a scheduler chose to go on after a length stop
                traj.status, traj.reason = "running", None
            out = await hooks.call_first("step", trajectory=traj, completion=completion, turn=turn)
            self.apply_step(traj, out)
            if self.max_total_tokens and len(traj.input_ids) >= self.max_total_tokens:
                traj.status, traj.reason = "truncated", f"max_total_tokens ({self.max_total_tokens}) reached"
        if traj.status == "running":
            traj.status = "ok"
        return traj

    # --- building blocks (also for schedulers that override run) -------------------------------
    def stream(self, trajectory: Trajectory) -> TokenStream:
        """The token stream of ``trajectory`` (created from its prompt on first use)."""
        st = self._streams.get(trajectory.uuid)
        if st is None:
            st = TokenStream.start(self._require_tokenizer(), trajectory, self.tools)
            self._streams[trajectory.uuid] = st
        return st

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
        params = params or self.sampling_params or SamplingParams()
        ids = trajectory.input_ids
        if self.max_total_tokens:
            room = self.max_total_tokens - len(ids)
            if room <= 0:
                raise ConfigError(f"trajectory is already {len(ids)} tokens, max_total_tokens is {self.max_total_tokens}")
            params = params.replace(max_tokens=min(params.max_tokens, room))
        if not trajectory.turns:
            trajectory.policy_version = int(getattr(self.sampler, "policy_version", 0) or 0)
        completion = await self.sampler.generate(ids, params)
        st.record_sample(trajectory, completion, update_messages=update_messages)
        return completion

    def apply_step(self, trajectory: Trajectory, out: Any) -> None:
        """Apply ``step``'s ms-swift-shaped result: messages, optional response tokens, infos."""
        if out is None:
            out = {}
        if isinstance(out, Trajectory):
            out = {"infer_request": out}
        if not isinstance(out, dict):
            raise ConfigError(f"{type(self).__name__}.step returned {type(out).__name__}; return a dict like {{'infer_request': request}}")
        req = out.get("infer_request")
        if req is not None and req is not trajectory:
            msgs = req.get("messages") if isinstance(req, dict) else getattr(req, "messages", None)
            if msgs is not None:
                trajectory.messages[:] = list(msgs)
        infos = out.get("rollout_infos")
        if infos:
            trajectory.infos.update(infos)
        st = self.stream(trajectory)
        if out.get("response_token_ids") is not None:
            st.replace_response(
                trajectory, list(out["response_token_ids"]), out.get("response_loss_mask"), out.get("rollout_logprobs")
            )
        st.sync(trajectory)

    def _hooks(self) -> Any:
        if self.hooks is None:
            from ..plugins import RunHooks

            self.hooks = RunHooks(SchedulerHooks(self))
        return self.hooks

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


def merge_turn_results(trajectory: Trajectory, results: list[Any]) -> bool:
    """Merge ``on_turn_end`` dicts: any ``done`` ends, ``infos`` merge, ``reward`` is a step reward."""
    done = False
    for r in results:
        if not isinstance(r, dict):
            continue
        done = done or bool(r.get("done"))
        if r.get("infos"):
            trajectory.infos.update(r["infos"])
        if r.get("reward") is not None:
            trajectory.step_rewards.append(float(r["reward"]))
    return done


class SchedulerHooks:
    """Adapter: a scheduler's ms-swift-named methods as ``rlcore`` hook implementations."""

    def __init__(self, scheduler: RolloutScheduler) -> None:
        self.scheduler = scheduler

    @hookimpl
    async def on_trajectory_start(self, trajectories: list[Trajectory]) -> None:
        await await_me_maybe(self.scheduler.on_trajectory_start(trajectories))

    @hookimpl
    async def on_turn_end(self, trajectory: Trajectory, completion: Completion, turn: int) -> Any:
        return await await_me_maybe(self.scheduler.on_turn_end(trajectory, completion, turn))

    @hookimpl
    async def step(self, trajectory: Trajectory, completion: Completion, turn: int) -> Any:
        return await await_me_maybe(self.scheduler.step(trajectory, completion, turn))

    @hookimpl
    async def check_finished(self, trajectory: Trajectory, completion: Completion, turn: int) -> Any:
        return await await_me_maybe(self.scheduler.check_finished(trajectory, completion, turn))


def build_scheduler(factory: Any, sampler: Any = None, tokenizer: Any = None, **options: Any) -> Any:
    """Construct a registered scheduler and attach ``sampler``/``tokenizer`` afterwards.

    The sampler is not passed to the constructor so that schedulers written the ms-swift way —
    ``def __init__(self, infer_engine=None, max_turns=None, *args, **kwargs)`` forwarding
    ``super().__init__(infer_engine, max_turns, *args, **kwargs)`` — work unchanged.
    """
    scheduler = factory(**options)
    if getattr(scheduler, "sampler", None) is None:
        scheduler.sampler = sampler
    if getattr(scheduler, "tokenizer", None) is None:
        scheduler.tokenizer = tokenizer
    return scheduler
