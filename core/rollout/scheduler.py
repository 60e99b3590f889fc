"""Rollout schedulers: the single-turn base and the multi-turn loop.

A scheduler decides what happens between generations. The driver knows one contract, this class's:
``on_trajectory_start(trajectories)`` once per batch, then per trajectory ``run(trajectory,
sampling_params)``, which returns the trajectory (or several, or
:class:`~rlcore.rollout.assemble.RolloutOutput` reports), and ``on_trajectory_end(trajectory)`` on
every path. The loop in :meth:`RolloutScheduler.run` calls the scheduler's own methods
``on_turn_end``, ``check_finished`` and ``step``, each with ``(trajectory, choice, turn)`` (``choice``
a :class:`ResponseChoice`, the view of the sampled completion); Python's method resolution and
``super()`` are the call order. pluggy serves registration and the observers a run names
(``observers``): they see every turn and may add infos, but never end a trajectory or change its
reward (see docs/concepts.md).

A scheduler written for ms-swift subclasses :mod:`rlcore.compat.swift`'s classes (what ``from rlcore
import MultiTurnScheduler`` gives): they adapt ms-swift's names (``infer_request``, ``response_choice``,
``infer_engine``, the 4.x helpers) to this contract once, in that base class.

Token exactness lives in :mod:`rlcore.rollout.stream`: schedulers edit ``messages`` only, the
engine turns those edits into loss-mask-0 tokens without re-tokenising what was sampled; the
invariant checker (:mod:`rlcore.rollout.invariants`) holds every result to the conversation.
"""

from __future__ import annotations

import contextvars
import inspect
from typing import Any

import attrs

from ..asyncutil import await_me_maybe
from ..errors import ConfigError
from ..types import ChatMessage, Completion, SamplingParams, Trajectory
from .stream import TokenStream
from .token_backed import restore_snapshots, snapshot_and_materialize

MAX_TURNS_HARD_CAP = 1000

#: the sampler calls of the trajectory whose ``run`` is executing (set per asyncio task by the driver;
#: a ``run`` override that samples through ms-swift's ``infer_engine`` records them here, and a
#: :class:`~rlcore.rollout.assemble.RolloutOutput` it returns is assembled against them)
SAMPLES: contextvars.ContextVar[list[Completion] | None] = contextvars.ContextVar("rlcore_samples", default=None)

#: uuids whose ``on_trajectory_start`` the driver already ran, seen from inside that trajectory's ``run``
STARTED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("rlcore_started", default=frozenset())


def as_sampling_params(given: Any, default: SamplingParams | None) -> SamplingParams | None:
    """``given`` as :class:`SamplingParams`: itself, ``default`` when None, or the sampling fields
    of a dict or of an object with those attributes (ms-swift's ``RequestConfig``) over ``default``."""
    if given is None or isinstance(given, SamplingParams):
        return given or default
    get = given.get if isinstance(given, dict) else (lambda k, d=None: getattr(given, k, d))
    base = default or SamplingParams()
    changes: dict[str, Any] = {}
    for name in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty"):
        v = get(name, None)
        if v is not None:
            changes[name] = v
    stop = get("stop", None)
    if stop:
        changes["stop"] = list(stop)
    return base.replace(**changes)


@attrs.define
class ResponseChoice:
    """What a scheduler's hooks (and the observers) get for a sampled turn: a view of the
    :class:`Completion` with the fields of ms-swift's ``ChatCompletionResponseChoice``.

    ``message`` is the reply, ``finish_reason`` and ``token_ids`` the completion's; ``logprobs`` has
    the OpenAI/ms-swift shape (``{"content": [{"token", "token_id", "logprob"}, …]}``), the flat
    list is ``completion.logprobs``. Other attributes (``text``, ``meta`` …) are the completion's.
    """

    completion: Completion
    tokenizer: Any = None
    index: int = 0

    @property
    def message(self) -> ChatMessage:
        return ChatMessage(role="assistant", content=self.completion.text)

    @property
    def finish_reason(self) -> str:
        return self.completion.finish_reason

    @property
    def token_ids(self) -> list[int]:
        return self.completion.token_ids

    @property
    def routed_experts(self) -> Any:
        """ms-swift 4.x's MoE routing record of the sample; rlcore's samplers record none (None)."""
        return self.completion.meta.get("routed_experts")

    @property
    def logprobs(self) -> dict[str, list[dict[str, Any]]] | None:
        lps = self.completion.logprobs
        if lps is None:
            return None
        ids = self.completion.token_ids
        toks = [self._token(t) for t in ids]
        return {"content": [{"token": s, "token_id": t, "logprob": lp} for s, t, lp in zip(toks, ids, lps)]}

    def _token(self, token_id: int) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.convert_ids_to_tokens(int(token_id)) or ""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.completion, name)


class RolloutScheduler:
    """Single-turn rollouts: one completion per trajectory. Base of every scheduler.

    Options: ``max_turns`` (1), ``sampling_params``, ``max_total_tokens`` (stop — truncated — once
    prompt + completion reach it), ``tools`` (JSON schemas rendered by the chat template). Any other keyword option is kept in ``self.options``. The driver sets
    ``sampler``/``tokenizer``/``sampling_params`` when they were not given.
    """

    name = "single_turn"
    default_max_turns = 1
    #: True lets an observer's ``{"done": True}`` from ``on_turn_end`` end a trajectory of this scheduler
    observers_may_stop = False

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
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.max_turns = int(max_turns) if max_turns is not None else self.default_max_turns
        if self.max_turns < 1:
            raise ConfigError(f"max_turns must be at least 1, got {max_turns}")
        self.sampling_params = sampling_params
        self.max_total_tokens = max_total_tokens
        self.tools = tools
        self.options = options
        self.observers: Any = None  # the run's RunHooks of named observers, set by the driver
        self._streams: dict[str, TokenStream] = {}

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """The JSON tool schemas the chat template renders (``tools``; ms-swift's base class, whose
        subclasses may keep callables in ``self.tools``, reads them elsewhere)."""
        return self.tools

    def tools_for(self, trajectory: Trajectory) -> list[dict[str, Any]] | None:
        """The tool schemas ``trajectory``'s chat template renders: its own
        (``infos["template_tools"]``, set when trajectories of one batch offer different tools, as
        TRL's dict of ``environment_factory`` does) or the scheduler's."""
        own = trajectory.infos.get("template_tools")
        return own if isinstance(own, list) else self.template_tools

    # --- lifecycle (override these; sync or async) ----------------------------------------------
    def on_trajectory_start(self, trajectories: list[Trajectory]) -> Any:
        """Once per batch before the first turn (reset environments, seed messages). Replacing a
        trajectory's ``messages`` here is enough: the prompt tokens follow them."""
        return None

    def on_turn_end(self, trajectory: Trajectory, choice: ResponseChoice, turn: int) -> dict[str, Any] | None:
        """After each assistant turn: ``{"done": bool, "reward": float, "infos": {...}}``
        (``rollout_infos`` is accepted for ``infos``) or None. ``done`` True ends the trajectory;
        False leaves the decision to ``check_finished``."""
        return None

    def step(self, trajectory: Trajectory, choice: ResponseChoice, turn: int) -> dict[str, Any]:
        """Build the next turn (edit ``trajectory.messages``; see :meth:`apply_step` for what a
        returned dict may carry); the default changes nothing, so the model continues its message."""
        return {"infer_request": trajectory}

    def check_finished(self, trajectory: Trajectory, choice: ResponseChoice, turn: int) -> bool:
        """Stop on a length-truncated completion or once ``max_turns`` turns are done."""
        if choice.finish_reason == "length":
            return True
        return turn >= self.max_turns

    def on_trajectory_end(self, trajectory: Trajectory) -> None:
        """Called on every path (ok, truncated, failed, cancelled): close per-trajectory resources."""

    async def close(self) -> None:
        """Release what the scheduler holds (not the sampler: the caller owns it)."""

    # --- the loop -----------------------------------------------------------------------------
    async def run(self, trajectory: Trajectory, sampling_params: Any = None, **kwargs: Any) -> Trajectory | list[Trajectory]:
        """Run one trajectory to the end: generate, ``on_turn_end``, ``check_finished``, ``step``.

        The scheduler's own methods are called directly, in that order; named observers see each
        turn after ``on_turn_end``."""
        params = as_sampling_params(sampling_params, self.sampling_params)
        turn = 0
        while trajectory.status == "running":
            turn += 1
            completion = await self.generate(trajectory, params)
            choice = ResponseChoice(completion, self.tokenizer)
            trajectory.num_turns = turn
            if completion.finish_reason == "length":
                trajectory.status, trajectory.reason = "truncated", "max_tokens reached"
            # hooks read text: token-backed assistant messages are decoded for them, then put back
            snaps = snapshot_and_materialize(self.tokenizer, trajectory.messages)
            try:
                done = apply_turn_end(trajectory, await await_me_maybe(self.on_turn_end(trajectory, choice, turn)))
                done = await self.observe_turn(trajectory, choice, turn) or done
                if trajectory.status == "failed":
                    break
                finished = done or bool(await await_me_maybe(self.check_finished(trajectory, choice, turn)))
            finally:
                restore_snapshots(snaps)
            if trajectory.status == "failed":
                break
            if finished or turn >= self.max_turns or turn >= MAX_TURNS_HARD_CAP:
                break
            if trajectory.status == "truncated":  # a scheduler chose to go on after a length stop
                trajectory.status, trajectory.reason = "running", None
            out = await await_me_maybe(self.step(trajectory, choice, turn))
            self.apply_step(trajectory, out, turn)
            if self.max_total_tokens and len(trajectory.sample_input_ids) >= self.max_total_tokens:
                trajectory.status, trajectory.reason = "truncated", f"max_total_tokens ({self.max_total_tokens}) reached"
        if trajectory.status == "running":
            trajectory.status = "ok"
        return trajectory

    async def observe_turn(self, trajectory: Trajectory, choice: ResponseChoice, turn: int) -> bool:
        """Tell the run's observers about a turn; their infos land in ``infos["observers"]``, their
        step rewards in ``infos["observer_rewards"]`` (never in the trained reward). Returns whether
        an observer asked to stop and this scheduler lets observers stop (``observers_may_stop``).
        The observers get the hookspec's keyword names (``infer_request``, ``response_choice``,
        ``current_turn``: the ``on_turn_end`` hook's contract, see :mod:`rlcore.hookspecs`)."""
        if self.observers is None:
            return False
        results = await self.observers.call_observers("on_turn_end", infer_request=trajectory, response_choice=choice, current_turn=turn)
        stop = False
        for plugin, r in results.items():
            if not isinstance(r, dict):
                continue
            stop = stop or bool(r.get("done"))
            box = trajectory.infos.setdefault("observers", {}).setdefault(plugin, {})
            box.update(r.get("infos") or r.get("rollout_infos") or {})
            if r.get("reward") is not None:
                trajectory.infos.setdefault("observer_rewards", {}).setdefault(plugin, []).append(float(r["reward"]))
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
        """Apply ``step``'s result: None, the trajectory, or a dict — ``infer_request`` (the
        trajectory, or an object or dict whose ``messages`` replace its messages), ``rollout_infos``
        (merged into ``infos``), ``response_token_ids`` (with ``response_loss_mask``,
        ``rollout_logprobs``: this round's response tokens). The keys are ms-swift's, so one
        ``step`` serves both; see :meth:`TokenStream.replace_response`."""
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
    message to ``trajectory.messages``) and/or ``check_finished`` — or ``run`` entirely."""

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
    """Whether an (overridden) ``run`` takes sampling params after the trajectory (ms-swift's
    ``request_config``), else ``run(trajectory)``."""
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
