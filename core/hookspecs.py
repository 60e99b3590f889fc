"""The hooks rlcore calls. Plugins implement them with ``@rlcore.hookimpl``.

Two kinds. *Registration* hooks run once when plugins load; each receives a ``register(name,
factory)`` callback. *Lifecycle* hooks run during a rollout or training step on what the run
chose: the scheduler (its methods), the named rewards and advantage estimator, and the observer
plugins the run names. An installed package that merely implements a lifecycle hook takes no part
in a run that does not name it. Lifecycle hooks may be ``async def``: the caller awaits them.
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

hookspec = pluggy.HookspecMarker("rlcore")
hookimpl = pluggy.HookimplMarker("rlcore")

Register = Callable[..., None]

# ---------------------------------------------------------------------------------------------------
# Registration hooks
# ---------------------------------------------------------------------------------------------------


@hookspec
def register_schedulers(register: Register) -> None:
    """Register rollout schedulers: ``register("my_scheduler", MySchedulerClass)``.

    The factory is called with the run's scheduler options as keyword arguments and must return a
    :class:`rlcore.rollout.RolloutScheduler` (or anything with the same methods).
    """


@hookspec
def register_envs(register: Register) -> None:
    """Register environments: ``register("guess_number", GuessNumberEnv)``.

    The factory is called with the environment's options and returns an :class:`rlcore.envs.Env`.
    """


@hookspec
def register_rewards(register: Register) -> None:
    """Register reward functions: ``register("accuracy", accuracy_fn)``.

    A reward is a function (sync or async) whose parameter names say what it needs (``completions``,
    ``trajectories``, any dataset column such as ``answer``, ``infos``, ``trainer_state`` …); it
    returns one float (or ``None``) per trajectory. A :class:`rlcore.rewards.Reward` subclass works too.
    A column parameter without a default is required: a dataset without that column is refused before
    training; give it a default (``answer=None``) to score such rows as ``None``.
    """


@hookspec
def register_losses(register: Register) -> None:
    """Register policy losses: ``register("grpo", grpo_loss)`` with the signature
    ``loss(logps, old_logps, advantages, mask, *, ref_logps=None, sampler_logps=None, is_valid=None, config) -> (loss, metrics)``.

    ``is_valid`` (bool [B]) is False for trajectories whose sampler logprobs are incomplete: rollout
    importance-sampling correction must be off for those rows.
    """


@hookspec
def register_advantages(register: Register) -> None:
    """Register advantage estimators: ``register("grpo", GRPOAdvantage)``. The factory gets the run's
    config and returns an object implementing ``compute_advantage``."""


@hookspec
def register_samplers(register: Register) -> None:
    """Register generation backends: ``register("hf", HFSampler)``. The factory is called with
    ``model=…, tokenizer=…`` and backend options, and returns a :class:`rlcore.sampling.Sampler`."""


@hookspec
def register_datasets(register: Register) -> None:
    """Register dataset sources: ``register("my_source", load_rows)``.

    A source is used wherever a dataset path is: ``--dataset my_source:SPEC?key=value&…``.
    The factory is called as ``load_rows(spec, **options)`` with the text after ``my_source:`` and
    the options (the query string's values parsed as JSON where they parse, merged with the run's
    ``dataset_options``) and returns a list of row dicts (``question``/``prompt``/``messages`` plus
    any columns rewards read), or a sequence that generates them when read, which stays lazy
    through training (a step reads only the rows it draws). It should raise :class:`rlcore.DatasetError` with one line for bad
    input; anything else it raises is reported as the source's failure.
    """


@hookspec
def register_tool_parsers(register: Register) -> None:
    """Register tool-call parsers: ``register("my_format", MyParser)``.

    The factory is called with no arguments (or ``tokenizer=`` when it declares that parameter) and
    returns an object whose ``parse(text, *, tools=None, prompt=None)`` gives the calls in an
    assistant message's text, in order, as :class:`rlcore.rollout.ToolCall` objects (it may take
    only ``text``). A call it cannot read is a ``ToolCall`` with ``error`` set, never an exception, and
    its time must stay linear in the text (policies write floods of unclosed tags). Runs choose one
    with ``tool_parser`` (``--tool-parser NAME``); see :class:`rlcore.rollout.tool_parsers.ToolParser`.
    """


@hookspec
def register_prompt_samplers(register: Register) -> None:
    """Register prompt samplers: ``register("my_order", MyPromptSampler)``.

    The factory is called as ``factory(cursor=…, **options)`` (``cursor``: the run's seeded
    :class:`rlcore.data.cursor.PromptCursor` over the dataset rows, saved in checkpoints; the
    options: ``prompt_sampler_options`` and the ``--flags`` it declares) and returns an object with
    ``take(k)`` (the next ``k`` row indices), ``observe(outcomes)`` (``(row index, [reward per
    completion])`` per scored group), ``metrics()`` (a dict of floats logged each step) and
    ``state_dict()`` / ``load_state_dict(state)`` (JSON-able, saved in checkpoints). Runs choose one
    with ``prompt_sampler`` (``--prompt-sampler NAME``); see :mod:`rlcore.training.prompt_sampler`.
    """


@hookspec
def register_commands(cli: Any) -> None:
    """Add subcommands to the ``rlcore`` command line. ``cli`` is the root :mod:`click` group:

    ``@cli.command() def hello(): ...``
    """


# ---------------------------------------------------------------------------------------------------
# Lifecycle hooks
#
# One vocabulary: ms-swift's argument names. The run's scheduler implements the per-turn hooks as
# its own methods and the rollout loop calls them directly (``self.step(...)``; Python's method
# resolution and ``super()`` are the order — no adapter, no second dispatcher). pluggy calls the
# same hooks on the observers a run names (``--observer NAME``), whose results are logged only.
# ---------------------------------------------------------------------------------------------------


@hookspec
def on_trajectory_start(trajectories: list[Any]) -> None:
    """Called once per batch before the first turn, with every trajectory of the batch.

    The scheduler's method runs first, then each named observer's. Schedulers reset environments
    here and may replace each trajectory's ``messages`` (the prompt tokens follow them); they may
    mark a trajectory failed (``trajectory.fail(reason)``) instead of raising.

    It runs once per trajectory: a scheduler's own call from inside ``run`` for a trajectory the
    driver already started (ms-swift 4.x's base ``run`` makes one) is skipped.

    Who calls it: the driver (:func:`rlcore.rollout.run_rollouts`), as the chosen scheduler's method
    ``scheduler.on_trajectory_start(trajectories)``, then through pluggy on the named observers
    (:meth:`rlcore.plugins.RunHooks.call_observers`).
    """


@hookspec
def on_turn_end(infer_request: Any, response_choice: Any, current_turn: int) -> dict[str, Any] | None:
    """Called after each assistant turn (``current_turn`` counts from 1) with the sampled choice.

    The scheduler's result counts: ``done`` (bool, ends the trajectory), ``infos`` (or ms-swift's
    ``rollout_infos``; merged into ``infer_request.infos``), ``reward`` (a step reward appended to
    ``step_rewards``). Observers' results are logged under ``infos["observers"][name]`` and
    ``infos["observer_rewards"]``: they never end a trajectory (unless the scheduler sets
    ``observers_may_stop``) and never enter the trained reward.

    Who calls it: the scheduler's turn loop (:meth:`rlcore.rollout.RolloutScheduler.run`, which the
    driver runs per trajectory) as its own method ``self.on_turn_end(…)``, then through pluggy on the
    named observers (:meth:`rlcore.plugins.RunHooks.call_observers`, keyword names as here).
    """


@hookspec(firstresult=True)
def step(infer_request: Any, response_choice: Any, current_turn: int) -> dict[str, Any] | None:
    """Build the next turn (the scheduler's method; one implementer per run).

    Returns ms-swift's shape: ``{"infer_request": request}`` after appending a message to
    ``request.messages`` (the engine appends that message's tokens, loss_mask 0), optionally with
    ``response_token_ids``, ``response_loss_mask``, ``rollout_logprobs`` and ``rollout_infos``.

    Who calls it: the scheduler's turn loop (:meth:`rlcore.rollout.RolloutScheduler.run`, which the
    driver runs per trajectory) as its own method ``self.step(…)``, before each turn after the first.
    Never through pluggy: a plugin's ``@hookimpl def step`` takes part only as a scheduler's method.
    """


@hookspec(firstresult=True)
def check_finished(infer_request: Any, response_choice: Any, current_turn: int) -> bool | None:
    """Whether the trajectory is finished after ``current_turn`` (the scheduler's method; one
    implementer per run). The base class stops on ``finish_reason == "length"`` or at ``max_turns``.

    Who calls it: the scheduler's turn loop (:meth:`rlcore.rollout.RolloutScheduler.run`, which the
    driver runs per trajectory) as its own method ``self.check_finished(…)`` after each turn that
    ``on_turn_end`` did not end. Never through pluggy.
    """


@hookspec
def compute_reward(trajectories: list[Any]) -> dict[str, list[float | None]] | None:
    """Score a batch. Every reward the run names runs; each returns named reward columns (one value
    per trajectory, ``None`` where it could not score). The trainer takes the weighted sum of the
    named rewards' columns; a named observer's columns are logged (``rewards``) but weigh 0.

    Who calls it: :func:`rlcore.rewards.compute_rewards`, through pluggy on the run's named rewards
    (:meth:`rlcore.plugins.RunHooks.call_all`; a plain reward function is wrapped into an
    implementer), then on the named observers. The trainer's scoring, the loop API's
    :class:`rlcore.loop.Rewards` and ``rlcore rollout --reward`` all go through that one function.
    """


@hookspec(firstresult=True)
def compute_advantage(rewards: Any, groups: list[str], trajectories: list[Any], config: Any) -> Any:
    """Turn rewards into advantages. First result wins (the run's chosen estimator).

    ``rewards`` is a float tensor [B] (NaN where no reward), ``groups`` the group id of each
    trajectory (the ``num_generations`` samples of one prompt share one). Returns a tensor [B]
    (sequence-level) or a list of per-completion-token lists (step-level estimators).

    Who calls it: the trainer and the loop API, each on the chosen estimator object directly
    (``estimator.compute_advantage(rewards=…, groups=…, trajectories=…, config=…)``; from a loop,
    calling the estimator, ``GRPOAdvantage()(rewards, num_generations=8)``, ends in the same method).
    One estimator per run: no pluggy call, so no other installed plugin's implementation takes part.
    """


LIFECYCLE_HOOKS = (
    "on_trajectory_start",
    "on_turn_end",
    "step",
    "check_finished",
    "compute_reward",
    "compute_advantage",
)
REGISTRATION_HOOKS = (
    "register_schedulers",
    "register_envs",
    "register_rewards",
    "register_losses",
    "register_advantages",
    "register_samplers",
    "register_datasets",
    "register_tool_parsers",
    "register_prompt_samplers",
    "register_commands",
)
#: registration hook -> component kind
KIND_OF_HOOK = {
    "register_schedulers": "scheduler",
    "register_envs": "env",
    "register_rewards": "reward",
    "register_losses": "loss",
    "register_advantages": "advantage",
    "register_samplers": "sampler",
    "register_datasets": "dataset",
    "register_tool_parsers": "tool_parser",
    "register_prompt_samplers": "prompt_sampler",
}
KINDS = tuple(KIND_OF_HOOK.values())
