"""Rollouts from a loop: run any registered scheduler on prompts (or prepared trajectories) and get
finished, checked trajectories back — the step ``GRPOTrainer``'s generation calls too.

    rollout = MultiTurnRollout(sampler, SamplingParams(max_tokens=64), scheduler="openenv_scheduler",
                               max_turns=6, env_url="http://127.0.0.1:8000")
    trajectories = rollout(prompts, num_generations=8)

Single-turn sampling is the same call with the ``default`` scheduler (:func:`sample`): the tokens a
loop trains on then come out of the same code path as the trainer's, token for token.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from ..asyncutil import run_sync
from ..errors import ConfigError
from ..plugins import get as get_component
from ..rollout.driver import RolloutResult, run_rollouts, template_tools
from ..rollout.invariants import check_batch, fail_violations
from ..rollout.scheduler import build_scheduler, scheduler_label
from ..types import Prompt, SamplingParams, Trajectory


def rollout_batch(
    scheduler: Any,
    prompts: Sequence[Prompt] | None,
    *,
    num_generations: int = 1,
    sampling_params: SamplingParams | None = None,
    observers: Sequence[str] = (),
    concurrency: int = 64,
    timeout: float | None = None,
    trajectories: list[Trajectory] | None = None,
    tokenizer: Any = None,
) -> RolloutResult:
    """Roll out, then hold the whole batch to the invariants once (tokens vs conversation, prompt,
    logprobs, unique uuids); a violating trajectory is failed, never trained on. A sampler that
    generates with a module (colocated ``hf``) runs it in eval mode. ``stats`` gains
    ``invariant_violations`` and ``invariant_check_s``."""
    module = getattr(getattr(scheduler, "sampler", None), "model", None)
    was_training = bool(getattr(module, "training", False))
    if was_training:
        module.eval()
    try:
        result = run_sync(run_rollouts(
            scheduler, list(prompts or []), num_generations=num_generations, sampling_params=sampling_params,
            components=(), observers=tuple(observers or ()), concurrency=concurrency, progress=False,
            timeout=timeout, trajectories=trajectories, check=False,  # checked batch-wide below, once
        ))
    finally:
        if was_training:
            module.train(True)
    t0 = time.perf_counter()
    tok = getattr(scheduler, "tokenizer", None) or tokenizer
    violations = check_batch(result.trajectories, tok, tools=template_tools(scheduler))
    result.stats["invariant_violations"] = fail_violations(result.trajectories, violations, scheduler_label(scheduler))
    result.stats["invariant_check_s"] = time.perf_counter() - t0
    return result


class Rollout:
    """Runs a scheduler (a registered name or an object) over prompts with ``sampler``.

    ``scheduler_options`` (``env_url``, ``tools``, ``max_concurrent_envs`` …) go to the scheduler as
    on the command line. Calling it returns the trajectories (``num_generations`` per prompt, in
    order, sharing their prompt's ``group_id``); :attr:`last_stats` holds the counts of the call.
    """

    default_scheduler = "default"

    def __init__(self, sampler: Any, sampling_params: SamplingParams | None = None, *, scheduler: Any = None,
                 tokenizer: Any = None, max_turns: int | None = None, num_generations: int = 1,
                 observers: Sequence[str] = (), concurrency: int = 64, timeout: float | None = None,
                 **scheduler_options: Any) -> None:
        self.sampler = sampler
        self.sampling_params = sampling_params or SamplingParams()
        self.tokenizer = tokenizer or getattr(sampler, "tokenizer", None)
        self.num_generations = int(num_generations)
        self.observers = tuple(observers)
        self.concurrency = int(concurrency)
        self.timeout = timeout
        scheduler = self.default_scheduler if scheduler is None else scheduler
        if isinstance(scheduler, str):
            if max_turns is not None:
                scheduler_options["max_turns"] = max_turns
            self.scheduler = build_scheduler(get_component("scheduler", scheduler), sampler, self.tokenizer,
                                             sampling_params=self.sampling_params, **scheduler_options)
        else:
            if scheduler_options or max_turns is not None:
                raise ConfigError("options go to a scheduler built by name; this scheduler object is built already")
            if getattr(scheduler, "sampler", None) is None:
                scheduler.sampler = sampler
            self.scheduler = scheduler
        self.last_stats: dict[str, Any] = {}

    def __call__(self, prompts: Sequence[Any] | None = None, *, num_generations: int | None = None,
                 trajectories: list[Trajectory] | None = None,
                 sampling_params: SamplingParams | None = None) -> list[Trajectory]:
        """Roll out ``prompts`` (Prompts, or texts / message lists / dataset rows, encoded with the
        chat template) ``num_generations`` times each, or the prepared ``trajectories``."""
        if prompts is None and trajectories is None:
            raise ConfigError("Rollout needs prompts or trajectories=")
        result = rollout_batch(
            self.scheduler, as_prompts(prompts or [], self.tokenizer), num_generations=num_generations or self.num_generations,
            sampling_params=sampling_params or self.sampling_params, observers=self.observers,
            concurrency=self.concurrency, timeout=self.timeout, trajectories=trajectories, tokenizer=self.tokenizer,
        )
        self.last_stats = result.stats
        return result.trajectories

    def close(self) -> None:
        """Release the scheduler's resources (env sessions, clients)."""
        close = getattr(self.scheduler, "close", None)
        if close is not None:
            from ..asyncutil import await_me_maybe

            run_sync(await_me_maybe(close()))

    def __enter__(self) -> "Rollout":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class MultiTurnRollout(Rollout):
    """A :class:`Rollout` whose default scheduler is ``multi_turn``; pass ``scheduler=`` for an
    environment (``openenv_scheduler``, ``gym_scheduler``) or tools (``tool_scheduler``)."""

    default_scheduler = "multi_turn"


def sample(sampler: Any, prompts: Sequence[Any], params: SamplingParams | None = None, *,
           num_generations: int | None = None, tokenizer: Any = None) -> list[Trajectory]:
    """Single-turn sampling as trajectories (token ids, logprobs, the conversation):
    ``num_generations`` (default ``params.n``) completions per prompt, through the ``default``
    scheduler — the path the trainer's single-turn rollouts take."""
    params = params or SamplingParams()
    n = int(num_generations or params.n or 1)
    return Rollout(sampler, params.replace(n=1), tokenizer=tokenizer)(prompts, num_generations=n)


def as_prompts(items: Sequence[Any], tokenizer: Any) -> list[Prompt]:
    """Prompts as given, or built from texts and message lists (a user conversation: chat-templated)
    or dataset rows (:func:`rlcore.data.row_to_prompt`, the trainer's rule: a plain-text ``prompt``
    column is not templated, as in TRL)."""
    from ..data import row_to_prompt

    out: list[Prompt] = []
    for item in items:
        if isinstance(item, Prompt):
            out.append(item)
            continue
        if tokenizer is None:
            raise ConfigError("prompts that are not rlcore.Prompt need a tokenizer (the sampler's, or tokenizer=)")
        if isinstance(item, str):
            row: dict[str, Any] = {"prompt": [{"role": "user", "content": item}]}
        elif isinstance(item, (list, tuple)):
            row = {"prompt": list(item)}
        elif isinstance(item, dict):
            row = item
        else:
            raise ConfigError(f"a prompt is a Prompt, a text, a message list or a row dict, not {type(item).__name__}")
        out.append(row_to_prompt(row, tokenizer))
    return out
