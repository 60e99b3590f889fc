"""What each kind of component must look like: one typed Protocol per kind, in one place.

Every kind has the same shape. A plugin registers a *factory* under a name
(``register_<kind>s``); the run builds it with the options it declares; the object the factory
returns (or, for functions, the factory itself) satisfies the Protocol below. A component's
options are the keyword parameters its factory declares (a loss, being a function, declares them
in :data:`OPTIONS_ATTR`), and they reach it three ways that all end in the same place:
``GRPOConfig.<kind>_options`` (a dict, or a JSON string from a config file), ``--flag VALUE`` on
``rlcore train`` / ``rlcore rollout`` (routed to whichever chosen component declares the flag), and
keyword arguments in Python.

======== ============================================ ===================== ===========================
kind     what the factory returns                     options field         protocol
======== ============================================ ===================== ===========================
scheduler a rollout scheduler (``RolloutScheduler``)  ``scheduler_options`` :class:`SchedulerLike`
sampler  a generation backend (``Sampler``)           ``sampler_options``   :class:`SamplerLike`
env      one text environment per trajectory (``Env``) ``env_options``      :class:`EnvLike`
reward   scores (a function, or a ``Reward``)         ``reward_options``    :class:`RewardLike`
loss     the policy loss function itself              ``loss_options``      :class:`LossLike`
advantage an estimator implementing ``compute_advantage`` ``advantage_options`` :class:`AdvantageLike`
======== ============================================ ===================== ===========================

The base classes (``rlcore.rollout.RolloutScheduler``, ``rlcore.Sampler``, ``rlcore.Env``,
``rlcore.Reward``) satisfy these and give defaults; the Protocols are what rlcore relies on, so a
class that does not subclass them works as long as it has these members. They are
``runtime_checkable`` (``isinstance(obj, SamplerLike)`` checks the members exist, not signatures).
"""

from __future__ import annotations

from typing import Any, Awaitable, Iterable, Mapping, Protocol, Union, runtime_checkable

#: the attribute on a loss function that declares its options: ``{name: default}``
OPTIONS_ATTR = "options"

#: the six kinds a run chooses, each with its ``GRPOConfig`` options field
KIND_OPTIONS: dict[str, str] = {
    "scheduler": "scheduler_options",
    "sampler": "sampler_options",
    "env": "env_options",
    "reward": "reward_options",
    "loss": "loss_options",
    "advantage": "advantage_options",
}

Weights = Union[Mapping[str, Any], Iterable[tuple[str, Any]]]


def declared_options(fn: Any) -> dict[str, Any]:
    """The options a function component declares in :data:`OPTIONS_ATTR` (name -> default): how a
    loss, whose parameters are its inputs, says which knobs it reads from its config."""
    declared = getattr(fn, OPTIONS_ATTR, None)
    return dict(declared) if isinstance(declared, Mapping) else {}


@runtime_checkable
class SamplerLike(Protocol):
    """Token-in / token-out generation. ``shares_trainer_module`` (class attribute): the factory
    takes the trainer's own module and generates with its parameters (nothing to sync)."""

    tokenizer: Any
    policy_version: int

    async def generate(self, prompt_ids: list[int], params: Any) -> Any: ...

    async def generate_n(self, prompt_ids: list[int], params: Any) -> list[Any]: ...

    def update_weights(
        self, weights: Weights, *, lora: bool = False, version: int | None = None
    ) -> Mapping[str, float] | None: ...

    def sleep(self, level: int = 1) -> None: ...

    def wake_up(self) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class SchedulerLike(Protocol):
    """Runs trajectories between generations (:class:`rlcore.rollout.RolloutScheduler`'s contract;
    ms-swift's schedulers have the same methods, their arguments named ``infer_request``,
    ``response_choice``, ``current_turn``)."""

    async def run(self, trajectory: Any) -> Any: ...

    def step(self, trajectory: Any, choice: Any, turn: int) -> Any: ...

    def check_finished(self, trajectory: Any, choice: Any, turn: int) -> bool: ...


@runtime_checkable
class EnvLike(Protocol):
    """One text environment per trajectory; sync or ``async def`` methods."""

    def reset(self, request: Any) -> Any: ...

    def step(self, action: Any) -> Any: ...

    def close(self) -> Any: ...


@runtime_checkable
class RewardLike(Protocol):
    """A reward: called with the columns it names (``completions``, ``answer`` …), one float or
    ``None`` per trajectory; may be ``async``."""

    def __call__(self, **kwargs: Any) -> list[float | None] | Awaitable[list[float | None]]: ...


@runtime_checkable
class LossLike(Protocol):
    """``loss(logps, old_logps, advantages, mask, *, ref_logps, sampler_logps, is_valid, config)
    -> (loss, metrics)``; ``config`` is a :class:`rlcore.algorithms.losses.LossConfig` whose
    attributes include the loss's own options."""

    def __call__(
        self,
        logps: Any,
        old_logps: Any,
        advantages: Any,
        mask: Any,
        *,
        ref_logps: Any = None,
        sampler_logps: Any = None,
        is_valid: Any = None,
        config: Any,
    ) -> tuple[Any, dict[str, float]]: ...


@runtime_checkable
class AdvantageLike(Protocol):
    """Rewards → advantages (the ``compute_advantage`` hook); ``stats`` is the last call's."""

    def compute_advantage(self, rewards: Any, groups: list[str], trajectories: list[Any], config: Any) -> Any: ...


PROTOCOLS: dict[str, type] = {
    "scheduler": SchedulerLike,
    "sampler": SamplerLike,
    "env": EnvLike,
    "reward": RewardLike,
    "loss": LossLike,
    "advantage": AdvantageLike,
}
