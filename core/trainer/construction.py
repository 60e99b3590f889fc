"""Building a :class:`~rlcore.trainer.grpo.GRPOTrainer`: TRL's constructor arguments checked
before the model loads (:class:`TRLAgent` for ``tools=``/``environment_factory=``/``rollout_func=``),
the model with its head, reference and teacher (:func:`load_models`), and the callbacks and
dataloader the ``transformers.Trainer`` underneath gets.

TRL's agent arguments choose one of the TRL schedulers that :mod:`rlcore.builtin_components`
registers (``trl_tools``, ``trl_environment``, ``trl_rollout_func``, implemented in
:mod:`rlcore.compat.trl.agents`); the trainer reaches them through the registry by name, never by
importing the compatibility layer.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterator

import attrs
import torch
from transformers import TrainerCallback

from ..algorithms.logprobs import PaddingFree, check_padding_free
from ..chat_template import prepare_multi_turn, set_chat_template_kwargs
from ..data.cursor import as_rows, check_columns
from ..errors import ConfigError
from ..gguf import resolve_model
from ..plugins import get as get_component
from ..rollout.scheduler import MAX_TURNS_HARD_CAP
from ..training import checkpoint as ckpt
from ..algorithms.entropy import EntropyBonus
from ..rewards import check_reward_columns
from ..training.components import (apply_peft, check_sleeps, load_model, load_tokenizer, make_advantage, make_rewards,
                                   make_sampler, make_scheduler, reference_model, sampling_params, teacher_model)
from ..training.config import GRPOConfig, check_values, validate_components
from ..training.model_options import cast_lm_head_to_fp32, router_aux
from .evaluation import eval_row_sets

#: the registered scheduler behind TRL's ``environment_factory=`` (its class answers the questions
#: asked before the model loads: which rewards the environments bring, which rows stand in for data)
ENVIRONMENT_SCHEDULER = "trl_environment"


def is_tokenizer(obj: Any) -> bool:
    return hasattr(obj, "apply_chat_template") and hasattr(obj, "decode")


def environment_reward_count(environment_factory: Any) -> int:
    """How many rewards TRL environments bring (classes with ``get_reward``), known before the model loads."""
    if environment_factory is None:
        return 0
    return len(get_component("scheduler", ENVIRONMENT_SCHEDULER).reward_types(environment_factory))


def environment_rows(args: Any, environment_factory: Any) -> list[dict[str, Any]]:
    """TRL: with no ``train_dataset`` the environment's ``reset()`` writes the prompt (placeholder rows)."""
    return get_component("scheduler", ENVIRONMENT_SCHEDULER).placeholder_rows(args, environment_factory)


@attrs.define
class TRLAgent:
    """TRL 1.16's agent arguments of ``GRPOTrainer``, checked: ``rollout_func`` chooses the
    ``trl_rollout_func`` scheduler, ``environment_factory`` ``trl_environment``, ``tools`` alone
    ``trl_tools`` (rlcore's tool loop with TRL's counters); none of them: the configured scheduler."""

    tools: list[Callable[..., Any]] = attrs.field(factory=list)
    environment_factory: Callable[[], Any] | None = None
    rollout_func: Callable[[list[Any], Any], dict[str, Any]] | None = None

    @classmethod
    def check(cls, args: Any, tools: Any, environment_factory: Any, rollout_func: Any, scheduler: Any) -> "TRLAgent":
        """Check TRL's agent arguments before the model loads."""
        if rollout_func is not None:
            if not callable(rollout_func):
                raise ConfigError(f"rollout_func must be a function (prompts, trainer) -> dict, got {type(rollout_func).__name__}")
            if tools or environment_factory is not None or scheduler is not None or args.scheduler != "default":
                raise ConfigError("rollout_func produces the completions itself; do not also pass tools, "
                                  "environment_factory or a scheduler")
        if isinstance(environment_factory, dict) and not environment_factory:
            raise ConfigError("environment_factory is an empty dict; map each environment name to a factory")
        if (tools or environment_factory is not None) and (scheduler is not None or args.scheduler != "default"):
            raise ConfigError("tools/environment_factory choose rlcore's tool scheduler; do not also set scheduler")
        if tools is not None and not isinstance(tools, (list, tuple)):
            raise ConfigError(f"tools must be a list of functions, got {type(tools).__name__}")
        for t in tools or []:
            if not callable(t):
                raise ConfigError(f"tool {t!r} is not callable; tools are Python functions")
        if environment_factory is not None and not callable(environment_factory) and not isinstance(environment_factory, dict):
            raise ConfigError("environment_factory must be a callable returning an environment (a class works)")
        return cls(list(tools or []), environment_factory, rollout_func)

    @property
    def scheduler_name(self) -> str | None:
        """The registered scheduler these arguments choose (None: no agent argument was given)."""
        if self.rollout_func is not None:
            return "trl_rollout_func"
        if self.environment_factory is not None:
            return ENVIRONMENT_SCHEDULER
        return "trl_tools" if self.tools else None

    @property
    def active(self) -> bool:
        return self.scheduler_name is not None

    def scheduler(self, args: Any, sampler: Any, tokenizer: Any, trainer: Any = None) -> Any:
        """The chosen scheduler, built from the registry. ``rollout_func(prompts, trainer)`` gets the
        trainer; the tool loop runs ``max_tool_calling_iterations`` rounds (TRL's unbounded default
        becomes rlcore's hard turn cap)."""
        factory = get_component("scheduler", self.scheduler_name)
        if self.rollout_func is not None:
            return factory(sampler, rollout_func=self.rollout_func, trainer=trainer, tokenizer=tokenizer,
                           sampling_params=sampling_params(args))
        rounds = args.max_tool_calling_iterations
        max_turns = MAX_TURNS_HARD_CAP if rounds is None else int(rounds) + 1
        kwargs: dict[str, Any] = {}
        if self.environment_factory is not None:
            kwargs["environment_factory"] = self.environment_factory
        return factory(sampler, tools=list(self.tools), tokenizer=tokenizer, max_turns=max_turns,
                       sampling_params=sampling_params(args), tool_parser=args.tool_parser, **kwargs)

    def rewards(self, scheduler: Any) -> list[Any]:
        """TRL: each environment class with a ``get_reward()`` is one more reward (weight 1)."""
        return scheduler.environment_rewards() if self.environment_factory is not None else []


@attrs.define
class Inputs:
    """GRPOTrainer's arguments, checked before the model loads."""

    args: GRPOConfig
    processing_class: Any
    eval_dataset: Any
    extra_rewards: list[Any]
    environment_rewards: int
    rows: list[dict[str, Any]]
    has_prompt: bool
    eval_rows: dict[str, list[dict[str, Any]]]
    agent: TRLAgent


def check_inputs(args: Any, reward_funcs: Any, train_dataset: Any, eval_dataset: Any, processing_class: Any, *,
                 tools: Any, rollout_func: Any, environment_factory: Any, scheduler: Any,
                 prompt_column: str | None) -> Inputs:
    """Every cheap check, before the model loads: the config, the output directory (another live
    run there is one line), sampling options, components and reward weights, the datasets' prompt
    column, TRL's agent arguments. A tokenizer passed as the 5th positional argument (TRL's
    eval_dataset) is taken as ``processing_class`` with a warning."""
    if eval_dataset is not None and is_tokenizer(eval_dataset) and processing_class is None:
        warnings.warn("the 5th positional argument of GRPOTrainer is eval_dataset, as in TRL; pass the tokenizer "
                      "as processing_class=", FutureWarning, stacklevel=3)
        eval_dataset, processing_class = None, eval_dataset
    args = args or GRPOConfig()
    if not isinstance(args, GRPOConfig):
        raise ConfigError(f"args must be a GRPOConfig, got {type(args).__name__}")
    check_values(args)
    if args.should_save:  # train() locks it
        ckpt.check_not_in_use(args.output_dir)
    sampling_params(args)  # generation_kwargs are checked before the model loads
    extra = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [] if reward_funcs is None else [reward_funcs]
    env_rewards = environment_reward_count(environment_factory)
    validate_components(args, extra_rewards=len(extra), environment_rewards=env_rewards)
    if train_dataset is None and environment_factory is not None:  # TRL: the environment owns the data
        train_dataset = environment_rows(args, environment_factory)
    rows = as_rows(train_dataset)
    has_prompt = check_columns(rows, prompt_column, "train_dataset")
    eval_rows = eval_row_sets(eval_dataset)
    for name, chunk in eval_rows.items():
        check_columns(chunk, prompt_column, f"eval_dataset[{name!r}]" if name else "eval_dataset")
    agent = TRLAgent.check(args, tools, environment_factory, rollout_func, scheduler)
    return Inputs(args, processing_class, eval_dataset, extra, env_rewards, rows, has_prompt, eval_rows, agent)


@attrs.define
class Models:
    """The policy (PEFT applied), its tokenizer and the frozen models beside it."""

    model: Any
    tokenizer: Any
    multi_turn_note: str
    router_aux: Any
    ref_model: Any
    teacher_model: Any


def load_models(model: Any, args: Any, processing_class: Any, quantization_config: Any, peft_config: Any) -> Models:
    """Load the policy, its tokenizer (every render of the policy's conversations with the run's
    chat-template kwargs), the reference model (``beta`` > 0 without LoRA) and the teacher (on-policy
    distillation); ``cast_lm_head_to_fp32`` casts the policy's head and so the reference's copy."""
    model = resolve_model(model)  # a .gguf file: its converted float32 directory, for every part of the run
    tokenizer = load_tokenizer(model, processing_class)
    set_chat_template_kwargs(tokenizer, args.chat_template_kwargs)
    #: how multi-turn episodes become sequences (the run header's ``multi-turn`` line)
    note = prepare_multi_turn(tokenizer, args.multi_turn_mode, chat_template=args.chat_template)
    model = apply_peft(load_model(model, args, quantization_config), args, peft_config)
    aux = router_aux(model, args.router_aux_loss_coef)  # MoE load-balancing loss (TRL's rule)
    if args.cast_lm_head_to_fp32:
        cast_lm_head_to_fp32(model)
    ref = reference_model(model, args)
    if args.cast_lm_head_to_fp32 and ref is not None:
        cast_lm_head_to_fp32(ref)
    return Models(model, tokenizer, note, aux, ref, teacher_model(model, args))


@attrs.define
class Components:
    """The run's rewards (with their weights), advantage estimator, loss and entropy bonus."""

    rewards: list[Any]
    reward_weights: dict[str, float]
    advantage: Any
    loss_fn: Any
    entropy_bonus: EntropyBonus | None


def make_components(inputs: Inputs, reward_processing_classes: Any) -> Components:
    """Build the configured components; a reward needing a column the dataset lacks is one line
    (a rollout_func's extra keys become columns only at run time). With TRL environments that
    bring rewards the run may configure none."""
    a = inputs.args
    rewards, weights = make_rewards(a, inputs.extra_rewards, reward_processing_classes,
                                    allow_none=inputs.environment_rewards > 0)
    if inputs.agent.rollout_func is None:
        check_reward_columns(rewards, inputs.rows, "train_dataset")
    # the entropy bonus is None unless entropy_coef / use_adaptive_entropy
    return Components(rewards, weights, make_advantage(a), get_component("loss", a.effective_loss_type),
                      EntropyBonus.from_args(a))


def place_components(trainer: Any, sampler: Any, scheduler: Any) -> None:
    """After ``Trainer.__init__`` (the module is placed): rewards and frozen models on the
    trainer's device, the sampler (asleep with ``sleep_sampler``), the scheduler (TRL's agent
    arguments' or the configured one) and its environments' rewards, padding-free checks, TRL's
    ``sync_ref_model``."""
    t, a, tokenizer = trainer, trainer.args, trainer.processing_class
    for r in t.reward_objects:  # reward models score on the trainer's device
        if hasattr(r, "model") and isinstance(r.model, torch.nn.Module) and r.model is not t.model:
            r.model.to(a.device)
        if hasattr(r, "chat_template_kwargs"):
            r.chat_template_kwargs = dict(a.chat_template_kwargs or {})
    t.sampler = make_sampler(a, t.model, tokenizer, sampler)
    if a.sleep_sampler:
        if not t.sleeps_sampler:
            raise ConfigError(f"sleep_sampler=True is for a sampler colocated with the trainer; {type(t).__name__}'s "
                              "samplers run in their own processes — set sleep_sampler=False")
        check_sleeps(t.sampler)
        t.sampler.sleep(level=2)  # asleep until the first generation, as TRL's colocated engine
    t.sampler_sleep = SamplerSleep(t.sampler, bool(a.sleep_sampler))
    t.scheduler_obj = t.agent.scheduler(a, t.sampler, tokenizer, trainer=t) if t.agent.active else \
        make_scheduler(a, t.sampler, tokenizer, scheduler)
    t.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    for reward in t.agent.rewards(t.scheduler_obj):  # TRL: an environment's get_reward(), weight 1
        t.reward_objects.append(reward)
        t.reward_weights[reward.name] = 1.0
    for frozen in (t.ref_model, t.teacher_model):
        if frozen is not None:
            frozen.to(a.device)
    #: padding-free micro-batches: how a forward lays its rows out (None: padded rows)
    t.padding_free = PaddingFree(a.padding_free_max_tokens, t._pad_multiple) if a.padding_free else None
    if t.padding_free is not None:  # a model that cannot take packed input is one line before training
        for m in (t.model, t.ref_model, t.teacher_model):
            if m is not None:
                check_padding_free(m)
    if a.sync_ref_model:
        if t.ref_model is None:
            raise ConfigError("sync_ref_model needs a separate reference model: set beta > 0 and train without LoRA")
        t.add_callback(RefModelSyncCallback(t))


class SamplerSleep:
    """``sleep_sampler``: the sampler is woken for a generation phase (after the weight sync, which
    already woke a sleeping vLLM's weights) and put back to sleep when it ends, so the training
    step between generations has the memory its KV cache (and, at level 2, vLLM's copy of the
    weights, re-sent by the next sync) held — TRL's ``vllm_enable_sleep_mode``. Nested phases
    wake it once."""

    def __init__(self, sampler: Any, enabled: bool) -> None:
        self.sampler, self.enabled, self.depth = sampler, enabled, 0

    @contextlib.contextmanager
    def awake(self) -> Iterator[None]:
        if not self.enabled or self.depth:
            yield
            return
        self.sampler.wake_up()
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            self.sampler.sleep(level=2)


class RefModelSyncCallback(TrainerCallback):
    """TRL's ``sync_ref_model`` (TR-DPO): every ``ref_model_sync_steps`` optimizer steps,
    ref ← α·policy + (1−α)·ref."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % int(args.ref_model_sync_steps) == 0:
            alpha = float(args.ref_model_mixup_alpha)
            policy = self.trainer.accelerator.unwrap_model(self.trainer.model)
            with torch.no_grad():
                for ref_p, p in zip(self.trainer.ref_model.parameters(), policy.parameters()):
                    ref_p.mul_(1.0 - alpha).add_(p.detach().to(ref_p.dtype), alpha=alpha)


class StepCounter(torch.utils.data.Dataset):
    """The Trainer's dataloader: one item per micro-step. Real data comes from the prompt cursor
    (whose position is checkpointed), so Trainer's own batch skipping on resume stays harmless."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i
