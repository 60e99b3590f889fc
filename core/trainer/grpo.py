"""``GRPOTrainer``: GRPO-family RL as a ``transformers.Trainer`` subclass.

Why a Trainer subclass: accelerate, mixed precision, gradient accumulation, ``report_to``,
``save_steps`` and ``resume_from_checkpoint`` then work exactly as transformers users expect. We
slot RL into it the way TRL does: the Trainer's micro-steps pull from a buffer of mini-batches; when
the buffer is empty one *generation step* refills it:

1. sync weights to the sampler (the colocated ``hf`` sampler shares the module: nothing to copy),
2. roll out ``num_generations`` trajectories per prompt through the chosen scheduler,
3. score them with every reward (weighted) and turn rewards into advantages (the chosen estimator),
4. record old logprobs when the policy will move before the batch is used up (μ>1 or several
   optimizer steps per generation) and reference logprobs when ``beta`` > 0,
5. cut ``num_iterations`` shuffled passes into micro-batches.

``compute_loss`` then scores one micro-batch with chunked logprobs and the chosen loss plugin.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
import traceback
import warnings
from typing import Any, Sequence

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..gguf import resolve_model
from ..plugins import get as get_component
from ..algorithms.advantages import AdvantageStats, group_indices
from ..algorithms.entropy import EntropyBonus
from ..algorithms.logprobs import PaddingFree, check_padding_free
from ..algorithms.losses import TOKEN_NORMALISED, LossConfig
from ..asyncutil import run_sync
from ..errors import ConfigError, RewardFunctionError
from ..plugins import RunHooks
from ..rewards import (
    NonFiniteRewardError,
    RewardContext,
    check_reward_columns,
    compute_rewards,
    normalize_then_sum,
)
from ..chat_template import prepare_multi_turn, set_chat_template_kwargs
from ..loop.loss import advantage_list, batch_logprobs, batch_loss, high_entropy_mask, pack, pad_to_multiple
from ..loop.rollouts import rollout_batch
from ..loop.sync import sync_weights as sync_policy_weights
from ..training import checkpoint as ckpt
from ..training.components import (
    apply_peft,
    check_sleeps,
    load_model,
    load_tokenizer,
    make_advantage,
    make_rewards,
    make_sampler,
    make_scheduler,
    reference_model,
    teacher_model,
    sampling_params,
)
from ..compat.trl.agents import (
    environment_reward_types,
    environment_rewards,
    placeholder_rows,
    trl_agent_options,
)
from ..training.config import GRPOConfig, check_values, validate_components
from ..training.data_parallel import (
    all_sum,
    mean_over_ranks,
    sum_over_ranks,
    weighted_mean_over_ranks,
    whole_batch,
    world,
)
from ..training.model_options import cast_lm_head_to_fp32, router_aux
from ..data.cursor import PromptCursor, as_rows, check_columns, make_prompt
from ..training.prompt_sampler import make_prompt_sampler
from ..training.dynamic_sampling import (
    DynamicSampling,
    check_metric as check_dynamic_sampling_metric,
    stop_line,
)
from ..training.health import RunHealth
from ..training.metrics import MetricAccumulator, append_jsonl, rollout_metrics, truncate_jsonl
from ..training.plots import write_plots
from ..training.step_progress import RichProgressCallback
from ..types import Batch, Trajectory

__all__ = ["GRPOConfig", "GRPOTrainer", "high_entropy_mask"]

logger = logging.getLogger(__name__)


def _fresh_streak() -> dict[str, Any]:
    """Dynamic sampling's count of skipped steps in a row (saved in checkpoints)."""
    return {"steps": 0, "rounds": 0, "groups": 0, "spread": 0, "values": [], "flat": None}


def _is_tokenizer(obj: Any) -> bool:
    return hasattr(obj, "apply_chat_template") and hasattr(obj, "decode")


def _eval_rows(eval_dataset: Any) -> dict[str, list[dict[str, Any]]]:
    """TRL's eval_dataset: one dataset ("" names it) or a dict name -> dataset (metrics get the name)."""
    if eval_dataset is None:
        return {}
    if isinstance(eval_dataset, dict):
        return {str(k): as_rows(v) for k, v in eval_dataset.items()}
    return {"": as_rows(eval_dataset)}


class RefModelSyncCallback(TrainerCallback):
    """TRL's ``sync_ref_model`` (TR-DPO): every ``ref_model_sync_steps`` optimizer steps,
    ref ← α·policy + (1−α)·ref."""

    def __init__(self, trainer: "GRPOTrainer") -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % int(args.ref_model_sync_steps) == 0:
            alpha = float(args.ref_model_mixup_alpha)
            policy = self.trainer.accelerator.unwrap_model(self.trainer.model)
            with torch.no_grad():
                for ref_p, p in zip(self.trainer.ref_model.parameters(), policy.parameters()):
                    ref_p.mul_(1.0 - alpha).add_(p.detach().to(ref_p.dtype), alpha=alpha)


class _StepCounter(torch.utils.data.Dataset):
    """The Trainer's dataloader: one item per micro-step. Real data comes from the prompt cursor
    (whose position is checkpointed), so Trainer's own batch skipping on resume stays harmless."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class GRPOTrainer(Trainer):
    """Train ``model`` with GRPO-family RL.

    Args:
        model: a HF id / path, or a ``PreTrainedModel``.
        reward_funcs: reward functions or registered names, in addition to ``args.reward_funcs``.
        args: a :class:`GRPOConfig`.
        train_dataset: rows (list of dicts or a ``datasets.Dataset``) with a prompt column.
        processing_class: the tokenizer (default: loaded from the model's path).
        sampler / scheduler: ready-made components instead of the configured names.
        peft_config: a ``peft.LoraConfig`` (or set ``args.use_peft``).
        prompt_column / system_prompt: how rows become prompts (see :mod:`rlcore.data.cursor`).
    """

    loss_is_scaled_for_ga = True  # compute_loss divides by gradient_accumulation_steps itself
    sleeps_sampler = True  # ``sleep_sampler`` applies (an in-process sampler, generating between training steps)

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        reward_processing_classes: Any = None,
        callbacks: list[Any] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        tools: list[Any] | None = None,
        rollout_func: Any = None,
        environment_factory: Any = None,
        *,
        sampler: Any = None,
        scheduler: Any = None,
        prompt_column: str | None = None,
        system_prompt: str | None = None,
        **kwargs: Any,
    ) -> None:
        if eval_dataset is not None and _is_tokenizer(eval_dataset) and processing_class is None:
            warnings.warn("the 5th positional argument of GRPOTrainer is eval_dataset, as in TRL; pass the tokenizer "
                          "as processing_class=", FutureWarning, stacklevel=2)
            eval_dataset, processing_class = None, eval_dataset
        args = args or GRPOConfig()
        if not isinstance(args, GRPOConfig):
            raise ConfigError(f"args must be a GRPOConfig, got {type(args).__name__}")
        check_values(args)
        if args.should_save:  # another live run in output_dir: one line before the model loads (train() locks it)
            ckpt.check_not_in_use(args.output_dir)
        sampling_params(args)  # generation_kwargs are checked before the model loads
        if reward_funcs is not None and not isinstance(reward_funcs, (list, tuple)):
            reward_funcs = [reward_funcs]
        extra = [r for r in (reward_funcs or [])]
        env_rewards = len(environment_reward_types(environment_factory))
        validate_components(args, extra_rewards=len(extra), environment_rewards=env_rewards)
        if train_dataset is None and environment_factory is not None:  # TRL: the environment owns the data
            train_dataset = placeholder_rows(args, environment_factory)
        self.rows = as_rows(train_dataset)
        self.prompt_column = prompt_column
        self.has_prompt = check_columns(self.rows, prompt_column, "train_dataset")
        self.system_prompt = system_prompt
        self.eval_rows = _eval_rows(eval_dataset)
        for name, rows in self.eval_rows.items():
            check_columns(rows, prompt_column, f"eval_dataset[{name!r}]" if name else "eval_dataset")
        self.agent = trl_agent_options(args, tools, environment_factory, rollout_func, scheduler)

        # --- model, tokenizer, components (after every cheap check) ----------------------------
        model = resolve_model(model)  # a .gguf file: its converted float32 directory, for every part of the run
        tokenizer = load_tokenizer(model, processing_class)
        set_chat_template_kwargs(tokenizer, args.chat_template_kwargs)  # every render of the policy's conversations
        #: how multi-turn episodes become sequences (the run header's ``multi-turn`` line)
        self.multi_turn_note = prepare_multi_turn(tokenizer, args.multi_turn_mode, chat_template=args.chat_template)
        model = apply_peft(load_model(model, args, quantization_config), args, peft_config)
        self.router_aux = router_aux(model, args.router_aux_loss_coef)  # MoE load-balancing loss (TRL's rule)
        if args.cast_lm_head_to_fp32:  # the policy's head, and so the copy the reference model starts from
            cast_lm_head_to_fp32(model)
        self.ref_model = reference_model(model, args)
        if args.cast_lm_head_to_fp32 and self.ref_model is not None:
            cast_lm_head_to_fp32(self.ref_model)
        self.teacher_model = teacher_model(model, args)  # on-policy distillation (loss_type opd / opd_coef)
        self.reward_objects, self.reward_weights = make_rewards(args, extra, reward_processing_classes,
                                                                     allow_none=env_rewards > 0)
        if self.agent.rollout_func is None:  # a rollout_func's extra keys become columns only at run time
            check_reward_columns(self.reward_objects, self.rows, "train_dataset")
        self.advantage = make_advantage(args)
        self.loss_fn = get_component("loss", args.effective_loss_type)
        self.entropy_bonus = EntropyBonus.from_args(args)  # None unless entropy_coef / use_adaptive_entropy
        super().__init__(
            model=model, args=args, train_dataset=None, eval_dataset=eval_dataset, processing_class=tokenizer,
            callbacks=callbacks, optimizers=optimizers, **kwargs,
        )
        for r in self.reward_objects:  # reward models score on the trainer's device
            if hasattr(r, "model") and isinstance(r.model, torch.nn.Module) and r.model is not self.model:
                r.model.to(self.args.device)
            if hasattr(r, "chat_template_kwargs"):
                r.chat_template_kwargs = dict(args.chat_template_kwargs or {})
        self.sampler = make_sampler(args, self.model, tokenizer, sampler)
        self._awake_depth = 0
        if args.sleep_sampler:
            if not self.sleeps_sampler:
                raise ConfigError(f"sleep_sampler=True is for a sampler colocated with the trainer; {type(self).__name__}'s "
                                  "samplers run in their own processes — set sleep_sampler=False")
            check_sleeps(self.sampler)
            self.sampler.sleep(level=2)  # asleep until the first generation, as TRL's colocated engine
        self.scheduler_obj = self.agent.scheduler(args, self.sampler, tokenizer, trainer=self) if self.agent.active else \
            make_scheduler(args, self.sampler, tokenizer, scheduler)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        for reward in environment_rewards(self.scheduler_obj):  # TRL: an environment's get_reward(), weight 1
            self.reward_objects.append(reward)
            self.reward_weights[reward.name] = 1.0
        if self.ref_model is not None:
            self.ref_model.to(self.args.device)
        if self.teacher_model is not None:
            self.teacher_model.to(self.args.device)
        #: padding-free micro-batches: how a forward lays its rows out (None: padded rows)
        self.padding_free = PaddingFree(args.padding_free_max_tokens, self._pad_multiple) if args.padding_free else None
        if self.padding_free is not None:  # a model that cannot take packed input is one line before training
            for m in (self.model, self.ref_model, self.teacher_model):
                if m is not None:
                    check_padding_free(m)
        if args.sync_ref_model:
            if self.ref_model is None:
                raise ConfigError("sync_ref_model needs a separate reference model: set beta > 0 and train without LoRA")
            self.add_callback(RefModelSyncCallback(self))

        # --- run state -------------------------------------------------------------------------
        self.cursor = PromptCursor(len(self.rows), seed=args.seed, shuffle=args.shuffle_dataset)
        # which rows each generation draws (prompt_sampler: uniform = the cursor as it is)
        self.prompt_sampler = make_prompt_sampler(args.prompt_sampler, self.cursor, args.prompt_sampler_options)
        self._prompt_rows: dict[str, int] = {}  # group id of a drawn prompt -> its row, until scored
        self._ds_streak = _fresh_streak()  # dynamic sampling: steps in a row with too few groups with spread
        self._skipped_micro_step = False
        if args.dynamic_sampling:
            check_dynamic_sampling_metric(args.dynamic_sampling_metric, [r.name for r in self.reward_objects])
        self._buffer: list[dict[str, Any]] = []
        self._train_metrics = MetricAccumulator()
        self._gen_metrics: dict[str, float] = {}
        self._rollout_time = 0.0
        self._sampled_tokens = 0.0
        self._last_log_time: float | None = None
        self._last_logged_step = 0
        self._generations = 0
        self.health = RunHealth(args.failure_threshold, args.failure_patience)
        self._pending_reward_metrics: dict[str, list[float]] = {}
        self._pending_reward_extras: dict[str, list[Any]] = {}
        self.completion_extras: dict[str, list[Any]] = {}
        self._reported_reward_errors: set[str] = set()
        self.plot_paths: list[str] = []
        if not args.disable_tqdm:
            self.remove_callback(ProgressCallback)
            self.remove_callback(PrinterCallback)
            self.progress_callback = RichProgressCallback()
            self.add_callback(self.progress_callback)
        else:
            self.progress_callback = None

    @property
    def _pad_multiple(self) -> int | None:
        """TRL's ``pad_to_multiple_of``; ``"auto"`` pads only on Neuron in TRL, where rlcore does not run."""
        p = self.args.pad_to_multiple_of
        return None if p in (None, "auto") else int(p)

    # --- the Trainer's data: micro-step counters -----------------------------------------------------
    @property
    def micro_steps_per_generation(self) -> int:
        """As in TRL: one generation batch feeds ``steps_per_generation`` micro-steps, ``num_iterations`` times."""
        return int(self.args.steps_per_generation) * self.args.num_iterations

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        gens_per_epoch = max(1, math.ceil(len(self.rows) / self.args.prompts_per_generation))
        n = gens_per_epoch * self.micro_steps_per_generation
        if self.args.max_steps and self.args.max_steps > 0:
            n = self.args.max_steps * self.args.gradient_accumulation_steps
        return torch.utils.data.DataLoader(_StepCounter(n), batch_size=1, collate_fn=lambda items: {"micro_step": items})

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        if not self.model.training:  # evaluation is not part of GRPO here
            return inputs
        if "batch" in inputs:  # a micro-batch already taken from the buffer (training_step took it first)
            return inputs
        if not self._buffer:
            self._buffer = self._generate_and_score()
        return self._buffer.pop(0)

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> Any:
        """``Trainer.training_step``, except for a step dynamic sampling skipped (too few groups with
        reward spread): no forward, no backward, so every gradient stays None and the optimizer moves
        no weight and no moment (the LR schedule and global_step still advance)."""
        model.train()  # as Trainer.training_step: _prepare_inputs takes a micro-batch in train mode only
        inputs = self._prepare_inputs(inputs)
        self._skipped_micro_step = bool(inputs.get("skip"))
        if self._skipped_micro_step:
            return torch.zeros((), device=self.args.device)
        return super().training_step(model, inputs, num_items_in_batch)

    # --- one generation step ----------------------------------------------------------------------------
    def _next_prompts(self, n: int | None = None) -> list[Any]:
        """This process's prompts of the next generation batch (``n`` prompts in all ranks, default
        ``prompts_per_generation``). Every data-parallel rank walks the same seeded order and keeps
        every ``world_size``-th prompt (whole groups, so group-relative advantages see complete groups)."""
        idx = self.prompt_sampler.take(self.args.prompts_per_generation if n is None else int(n))
        idx = idx[int(self.args.process_index) :: max(1, int(self.args.world_size))]
        prompts = [make_prompt(self.rows[i], self.processing_class, self.has_prompt, self.prompt_column,
                               self.args.max_prompt_length, self.system_prompt) for i in idx]
        self._prompt_rows.update((p.group_id, i) for p, i in zip(prompts, idx))
        return prompts

    def _observe_prompts(self, trajs: Sequence[Trajectory]) -> None:
        """Tell the prompt sampler how each drawn prompt's group scored (every rank's groups, in rank
        order, so each rank's sampler keeps the same history and draws the same prompts)."""
        from ..training.data_parallel import gather_objects

        if self.args.prompt_sampler == "uniform":  # nothing to learn from scores: no collective per generation
            self._prompt_rows.clear()
            return
        groups: dict[str, list[float | None]] = {}
        for t in trajs:
            if t.group_id in self._prompt_rows:
                groups.setdefault(t.group_id, []).append(None if t.status == "failed" else t.reward)
        mine = [(self._prompt_rows.pop(g), rewards) for g, rewards in groups.items()]
        self.prompt_sampler.observe([o for part in gather_objects(mine) for o in part])

    def sync_weights(self) -> None:
        """Make the sampler generate with the current policy (:func:`rlcore.loop.sync_weights`: a
        colocated ``hf`` sampler shares the module and only takes the step as its version)."""
        sync_policy_weights(self.accelerator.unwrap_model(self.model), self.sampler, version=int(self.state.global_step))

    @contextlib.contextmanager
    def _sampler_awake(self) -> Any:
        """With ``sleep_sampler``: the sampler is woken for a generation phase (after the weight sync,
        which already woke a sleeping vLLM's weights) and put back to sleep when it ends, so the
        training step between generations has the memory its KV cache (and, at level 2, vLLM's
        copy of the weights, re-sent by the next sync) held — TRL's ``vllm_enable_sleep_mode``."""
        if not self.args.sleep_sampler or self._awake_depth:
            yield
            return
        self.sampler.wake_up()
        self._awake_depth += 1
        try:
            yield
        finally:
            self._awake_depth -= 1
            self.sampler.sleep(level=2)

    def rollout(self, prompts: Sequence[Any], num_generations: int | None = None) -> list[Trajectory]:
        """Roll out ``prompts`` through the scheduler (the module in eval mode) and hold the batch to
        the rollout invariants; a violation fails that trajectory and is counted."""
        was_training = self.model.training
        self.model.eval()
        try:
            with self._sampler_awake():
                return self._take_rollout(self._run_rollouts(prompts, num_generations))
        finally:
            self.model.train(was_training)

    def _take_rollout(self, result: Any) -> list[Trajectory]:
        """A finished batch's trajectories; its invariant counts become this step's metrics (on the
        thread that trains, never from a background rollout)."""
        self._invariant_failures = int(result.stats["invariant_violations"])
        self._invariant_check_s = float(result.stats["invariant_check_s"])
        return result.trajectories

    def _run_rollouts(self, prompts: Sequence[Any], num_generations: int | None = None) -> Any:
        """One batch through the run's scheduler with the run's sampling, concurrency, timeout and
        observers (:func:`rlcore.loop.rollout_batch`, the loop API's rollout step), checked batch-wide
        once; no change of this trainer's module mode and no run state written (the Ray trainer's
        background prefetch calls it too). Returns the rollout result (trajectories and stats)."""
        return rollout_batch(
            self.scheduler_obj, list(prompts), num_generations=num_generations or self.args.num_generations,
            sampling_params=sampling_params(self.args), observers=tuple(self.args.observers or ()),
            concurrency=self.args.rollout_concurrency, timeout=self.args.rollout_timeout,
            tokenizer=self.processing_class,
        )

    def _score(self, trajs: list[Trajectory]) -> tuple[Any, dict[str, list[float | None]], AdvantageStats]:
        columns = self._reward_columns(trajs)
        # data-parallel: the estimator sees every rank's batch (batch statistics as one process would
        # compute them); this rank keeps its slice. One process: the batch is this one.
        self.whole_batch = whole = whole_batch(trajs, columns)
        stats = self._advantages(whole)
        return whole.local(self.whole_advantages), columns, stats

    def _reward_columns(self, trajs: list[Trajectory]) -> dict[str, list[float | None]]:
        """Score ``trajs`` with every reward (columns on the trajectories, the weighted sum in
        ``.reward``); a reward failing on every sample stops the run."""
        context = RewardContext(trainer_state=self.state, log_metric=self._log_reward_metric, log_extra=self._log_reward_extra,
                                environment_of=getattr(self.scheduler_obj, "environment_for", None))
        for r in self.reward_objects:
            if hasattr(r, "trainer_state"):
                r.trainer_state = self.state
            r.context = context
        hooks = RunHooks(*self.reward_objects, observers=tuple(self.args.observers or ()))
        errors_before = {r.name: getattr(r, "errors", 0) for r in self.reward_objects}
        timeouts_before = {r.name: getattr(r, "timeouts", 0) for r in self.reward_objects}
        columns = run_sync(compute_rewards(hooks, trajs, self.reward_weights))
        self._reward_errors = {
            f"reward_errors/{r.name}": float(getattr(r, "errors", 0) - errors_before[r.name]) for r in self.reward_objects
        }
        self._reward_errors.update({  # samples a bounded reward stopped at its deadline (scored 0)
            f"reward_timeouts/{r.name}": float(r.timeouts - timeouts_before[r.name])
            for r in self.reward_objects if hasattr(r, "timeouts")
        })
        self._check_reward_failures(len(trajs))
        return columns

    def _advantages(self, whole: Any) -> AdvantageStats:
        """The advantage estimator over ``whole`` (every rank's trajectories): ``whole_advantages``."""
        groups = [t.group_id for t in whole.trajectories]
        if self.args.multi_objective_aggregation == "normalize_then_sum":  # GDPO: each reward normalised per group first
            rewards = torch.tensor(normalize_then_sum(whole.columns, self.reward_weights, groups,
                                                      scorable=[t.status != "failed" for t in whole.trajectories]),
                                   dtype=torch.float32)
        else:
            rewards = torch.tensor([
                math.nan if (t.reward is None or t.status == "failed") else float(t.reward) for t in whole.trajectories
            ], dtype=torch.float32)
        adv = run_sync(RunHooks(self.advantage, observers=False).call_first(
            "compute_advantage", rewards=rewards, groups=groups, trajectories=whole.trajectories, config=self.args))
        if adv is None:
            raise ConfigError(f"advantage estimator {self.args.advantage!r} returned nothing")
        stats = getattr(self.advantage, "stats", None)
        if not isinstance(stats, AdvantageStats):
            stats = AdvantageStats(groups=len(group_indices(groups)))
        self.whole_advantages = advantage_list(adv)
        return stats

    def _check_reward_failures(self, n: int) -> None:
        """A reward that raised (or scored ±inf) on every sample stops the run (chained to its first
        exception, so that traceback shows once); one that failed on some samples is reported once
        per run (once for raising, once for ±inf)."""
        for r in self.reward_objects:
            failures = getattr(r, "last_failures", None) or []
            if not failures:
                continue
            raised = [f for f in failures if not isinstance(f, NonFiniteRewardError)]
            inf = sorted({repr(f.value) for f in failures if isinstance(f, NonFiniteRewardError)}, reverse=True)
            if not inf:
                what = f"raised on {len(failures)}"
            else:
                what = (f"raised on {len(raised)} and " if raised else "") + \
                    f"returned {' or '.join(inf)} on {len(failures) - len(raised)}"
            finite = "a reward returns a finite number (or None) per completion"
            first = raised[0] if raised else None
            if len(failures) >= n > 0:
                if not inf:
                    raise RewardFunctionError(
                        f"reward {r.name!r} raised on all {n} samples ({type(first).__name__}: {first}); "
                        "fix the reward function (its traceback is above)"
                    ) from first
                if first is None:
                    raise RewardFunctionError(f"reward {r.name!r} returned {' or '.join(inf)} on all {n} samples; "
                                              f"{finite} — fix the reward function") from None
                raise RewardFunctionError(
                    f"reward {r.name!r} {what} of {n} samples ({type(first).__name__}: {first}); {finite} — "
                    "fix the reward function (its traceback is above)") from first
            key = r.name if first is not None else f"{r.name} (non-finite)"
            if key not in self._reported_reward_errors:
                self._reported_reward_errors.add(key)
                if first is None:
                    logger.warning("reward %r %s of %d samples; they get no reward (counted in reward_errors/%s) — %s",
                                   r.name, what, n, r.name, finite)
                else:
                    logger.warning(
                        "reward %r %s of %d samples; they get no reward (counted in reward_errors/%s). First error:\n%s",
                        r.name, what, n, r.name, "".join(traceback.format_exception(first)).rstrip(),
                    )

    def _log_reward_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric`` for rewards: averaged into the step's metrics under ``name``."""
        self._pending_reward_metrics.setdefault(str(name), []).append(float(value))

    def _log_reward_extra(self, column: str, values: list[Any]) -> None:
        """TRL's ``log_extra`` for rewards: a column beside the logged completions."""
        self._pending_reward_extras.setdefault(str(column), []).extend(list(values))

    def _generate_and_score(self) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        self.sync_weights()
        ds = None
        if self.args.dynamic_sampling:  # rounds of prompts until the batch's groups all have reward spread
            trajs, generated, ds, t_rollout = self._dynamic_sampling_rounds(t0)
            stats = self._advantages(self.whole_batch) if self.whole_batch.trajectories else AdvantageStats(groups=0)
            if not self.whole_batch.trajectories:
                self.whole_advantages = []
            adv = self.whole_batch.local(self.whole_advantages)
        else:
            prompts = self._next_prompts()
            trajs = self.rollout(prompts)
            t_rollout = time.perf_counter() - t0
            adv, columns, stats = self._score(trajs)
            self._observe_prompts(trajs)
            generated = self.whole_batch
        adv_list = advantage_list(adv)
        if ds is not None and ds.short:  # too few groups with spread: this step trains on nothing (see training_step)
            empty = pack([], [], self.pad_token_id, device=self.args.device)
            micro = [{"batch": empty, "num_items": 0.0, "skip": True} for _ in range(self.micro_steps_per_generation)]
            batch = None
        else:
            # failed (and, if asked, truncated) trajectories do not train
            batch = pack(trajs, adv_list, self.pad_token_id, mask_truncated=self.args.mask_truncated_completions,
                         device=self.args.device)
            batch = pad_to_multiple(batch, self._pad_multiple, self.pad_token_id)
            if batch.size:  # a rank whose share of a short dynamic-sampling batch is empty has nothing to score
                self._attach_logps(batch)
        whole = generated  # every rank's batch (every round's): metrics and the health verdict speak for the run
        self._gen_metrics = rollout_metrics(whole.trajectories, whole.columns, stats.zero_std_frac)
        self._gen_metrics.update(getattr(self, "_reward_errors", {}))
        if ds is not None:
            self._gen_metrics.update(ds.metrics())
            kept = max(1.0, self._gen_metrics["dynamic_sampling/kept_groups"])
            if not ds.short:  # what one group with a learning signal cost in sampled tokens (every round's)
                self._gen_metrics["dynamic_sampling/tokens_per_kept_group"] = self._gen_metrics["sampled_tokens"] / kept
        self._gen_metrics.update(self.prompt_sampler.metrics())  # prompt_sampler/skipped … (uniform: none)
        self._gen_metrics["invariant_violations"] = float(getattr(self, "_invariant_failures", 0))
        self._gen_metrics["invariant_check_time"] = float(getattr(self, "_invariant_check_s", 0.0))
        self.health.check(whole.trajectories)  # raises RunFailedError on a dead run (on every rank alike)
        if ds is not None:
            self._dynamic_sampling_verdict(ds)  # failure_patience skipped steps in a row: the run stops
        for name, values in self._pending_reward_metrics.items():
            self._gen_metrics[name] = sum(values) / len(values) if values else float("nan")
        self._pending_reward_metrics = {}
        # a reward's log_extra columns line up with one rollout; dynamic sampling's batch is picked from several
        self.completion_extras = self._pending_reward_extras if ds is None else {}
        self._pending_reward_extras = {}
        if self.args.log_completions and self.whole_batch.trajectories:  # the trained batch
            self._log_completions(self.whole_batch.trajectories, self.whole_advantages, extras_from=self.whole_batch.start)
        scheduler_metrics = getattr(self.scheduler_obj, "metrics", None)
        if callable(scheduler_metrics):  # e.g. openenv/* client counters (retries, timeouts, sessions)
            self._gen_metrics.update({k: float(v) for k, v in scheduler_metrics().items()})
        self._rollout_time += time.perf_counter() - t0
        self._gen_metrics["rollout_only_time"] = t_rollout
        self._sampled_tokens += self._gen_metrics["sampled_tokens"]
        if self.model.training:  # TRL's num_tokens: prompt + completion tokens seen so far (all ranks)
            seen = sum(len(t.prompt_ids) + len(t.completion_ids) for t in whole.trajectories)
            self.state.num_input_tokens_seen = int(getattr(self.state, "num_input_tokens_seen", 0) or 0) + seen
        self._gen_metrics["num_tokens"] = float(self.state.num_input_tokens_seen)
        self._generations += 1
        return micro if batch is None else self._micro_batches(batch)

    # --- dynamic sampling (DAPO) --------------------------------------------------------------------
    def _rollout_refill(self, prompts: Sequence[Any]) -> list[Trajectory]:
        """A dynamic-sampling refill round: rolled out now, with the current policy."""
        return self.rollout(prompts)

    def _rounds_done(self) -> None:
        """Called when a step's dynamic-sampling rounds are over (the Ray trainer starts its prefetch)."""

    def _dynamic_sampling_verdict(self, ds: DynamicSampling) -> None:
        """Count skipped steps in a row (and what their groups scored); ``failure_patience`` of them
        stop the run with one line naming the reward that gave every group one score."""
        if not ds.short:
            self._ds_streak = _fresh_streak()
            return
        k = self._ds_streak
        k["steps"] += 1
        k["rounds"] += ds.rounds
        k["groups"] += ds.generated_groups
        k["spread"] += len(ds.kept)
        k["values"] = sorted(set(k["values"]) | ds.flat_values)[:16]
        flat = ds.flat_columns or []
        k["flat"] = flat if k["flat"] is None else [c for c in k["flat"] if c in flat]
        self._gen_metrics["dynamic_sampling/skipped_in_a_row"] = float(k["steps"])
        if k["steps"] >= self.args.failure_patience:
            from ..errors import RunFailedError

            raise RunFailedError(stop_line(k["flat"], self.args.dynamic_sampling_metric, k["values"], k["rounds"],
                                           k["steps"], k["groups"], self.args.max_resample_rounds, spread=k["spread"],
                                           min_groups=self.args.min_groups, gens=self.args.num_generations,
                                           reward_names=[r.name for r in self.reward_objects]))
        logger.warning("dynamic sampling: %d of %d groups had reward spread after %d rounds, fewer than min_groups=%d; "
                       "step %d is skipped (no update; %d skipped in a row, the run stops at failure_patience=%d)",
                       len(ds.kept), ds.generated_groups, ds.rounds, self.args.min_groups, self.state.global_step + 1,
                       k["steps"], self.args.failure_patience)

    def _dynamic_sampling_rounds(self, t0: float) -> tuple[list[Trajectory], Any, DynamicSampling, float]:
        """Draw, roll out and score rounds of prompts until the batch has ``prompts_per_generation``
        groups with reward spread (or ``max_resample_rounds`` extra rounds are spent). Every rank
        decides from every rank's groups, so all keep the same groups, and each trains its
        ``world_size``-th share of them (the batch shape one process would have, cut alike).
        Returns this rank's trajectories to train, every round's trajectories (a WholeBatch, for the
        metrics), the step's bookkeeping and the rollout time; sets ``whole_batch`` to the kept batch."""
        from ..training.data_parallel import WholeBatch, gather_objects

        a = self.args
        rank, size = world()
        ds = DynamicSampling(a.prompts_per_generation, a.max_resample_rounds, a.min_groups, a.dynamic_sampling_metric)
        generated: list[Trajectory] = []
        names: list[str] = []
        errors: dict[str, float] = {}
        t_rollout = 0.0
        invariants = [0, 0.0]  # every round's invariant violations and check time
        while (n := ds.next_draw()):
            t1 = time.perf_counter()
            prompts = self._next_prompts(n)
            trajs = self.rollout(prompts) if ds.rounds == 0 else self._rollout_refill(prompts)
            t_rollout += time.perf_counter() - t1
            invariants[0] += int(getattr(self, "_invariant_failures", 0))
            invariants[1] += float(getattr(self, "_invariant_check_s", 0.0))
            columns = self._reward_columns(trajs)
            for k, v in getattr(self, "_reward_errors", {}).items():
                errors[k] = errors.get(k, 0.0) + v
            self._observe_prompts(trajs)  # a filtered group still tells the prompt sampler how its prompt scored
            whole = whole_batch(trajs, columns)
            names.extend(c for c in whole.columns if c not in names)
            # draw order: rank r rolled out prompts r, r + size, r + 2·size … of the round
            parts = gather_objects([t.group_id or t.uuid for t in trajs])
            where: dict[str, tuple[int, int]] = {}
            for r, gids in enumerate(parts):
                for j, g in enumerate(dict.fromkeys(gids)):
                    where.setdefault(g, (j * size + r, r))
            ordered = sorted(whole.trajectories, key=lambda t: where.get(t.group_id or t.uuid, (1 << 30, 0)))
            ds.add(ordered, drawn=n)
            generated.extend(whole.trajectories)
        self._rounds_done()
        self._reward_errors = errors
        self._invariant_failures, self._invariant_check_s = invariants
        groups = ds.take()
        shares = [groups[r::size] for r in range(size)]
        kept: list[Trajectory] = []
        start = stop = 0
        for r, share in enumerate(shares):
            if r == rank:
                start = len(kept)
            kept.extend(t for g in share for t in g)
            if r == rank:
                stop = len(kept)

        def cols(trajs: list[Trajectory]) -> dict[str, list[float | None]]:
            return {c: [t.rewards.get(c) for t in trajs] for c in names}

        self.whole_batch = WholeBatch(kept, cols(kept), start, stop)
        mine = [t for g in shares[rank] for t in g]
        return mine, WholeBatch(generated, cols(generated), 0, 0), ds, t_rollout

    def _log_completions(self, trajs: list[Trajectory], advantages: list[Any], prefix: str = "",
                         extras_from: int = 0) -> None:
        """TRL's ``log_completions``: every prompt, completion, reward column and advantage of this
        generation appended to OUTPUT_DIR/completions.jsonl; ``num_completions_to_print`` printed.
        ``trajs`` may be every rank's batch; the reward functions' ``log_extra`` columns are this
        rank's, starting at ``extras_from``."""
        from ..rewards import reward_inputs, trl_reward_inputs

        view = trl_reward_inputs(reward_inputs(trajs))
        records = []
        # a training batch is generated for the optimizer step about to run: the step the progress bar
        # and metrics.jsonl give it (it printed `[step 0]` beside the bar's step 1); evaluation runs
        # after a step and keeps that step's number
        step = int(self.state.global_step) + (0 if prefix else 1)
        for i, t in enumerate(trajs):
            adv = advantages[i] if i < len(advantages) else None
            rec: dict[str, Any] = {"step": step, "split": prefix or "train",
                                   "prompt": view["prompts"][i], "completion": view["completions"][i],
                                   "rewards": dict(t.rewards), "reward": t.reward,
                                   "advantage": adv if not isinstance(adv, list) else (adv[0] if adv else None),
                                   "status": t.status}
            if t.has_turn_samples:  # the sequences this episode trains as (docs/chat-templates.md)
                rec["samples"] = [{"prompt_tokens": len(s.prompt_ids), "completion": "".join(turn.text for turn in s.turns)}
                                  for s in t.turn_samples()]
            for column, values in self.completion_extras.items():
                if 0 <= i - extras_from < len(values):
                    rec[column] = values[i - extras_from]
            records.append(rec)
        if self.args.log_unique_prompts:  # TRL: the logged table keeps the first completion of each distinct prompt
            seen: set[str] = set()
            records = [r for r in records if not (str(r["prompt"]) in seen or seen.add(str(r["prompt"])))]
        if self.args.should_save:
            os.makedirs(self.args.output_dir, exist_ok=True)
            with open(os.path.join(self.args.output_dir, "completions.jsonl"), "a", encoding="utf-8") as f:
                for rec in records:
                    f.write(json.dumps(rec, default=str) + "\n")
            n = self.args.num_completions_to_print
            for rec in records[: len(records) if n is None else int(n)]:
                print(f"[step {rec['step']}] reward={rec['reward']} advantage={rec['advantage']}\n"
                      f"  prompt: {str(rec['prompt'])[:200]}\n  completion: {str(rec['completion'])[:400]}")

    # --- evaluation: roll out the eval prompts and score them, as TRL does --------------------------
    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """Roll out every eval prompt ``num_generations_eval`` times with the current policy, score
        with the training rewards, and log TRL's keys under ``eval_`` (``eval_reward``,
        ``eval_rewards/<f>/mean``, ``eval_completions/mean_length`` …) plus ``eval_loss``."""
        sets = _eval_rows(eval_dataset) if eval_dataset is not None else self.eval_rows
        if not sets:
            raise ConfigError("evaluation needs an eval_dataset (pass eval_dataset= to GRPOTrainer)")
        out: dict[str, float] = {}
        train_metrics, self._train_metrics = self._train_metrics, MetricAccumulator()
        was_training = self.model.training
        self.model.eval()
        try:
            for name, rows in sets.items():
                prefix = f"{metric_key_prefix}_{name}" if name else metric_key_prefix
                out.update(self._evaluate_rows(rows, prefix))
        finally:
            self.model.train(was_training)
            self._train_metrics = train_metrics
        if self.args.should_save:
            append_jsonl(self.args.output_dir, {"step": self.state.global_step, **out})
        self.log(out)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, out)
        return out

    def _evaluate_rows(self, rows: list[dict[str, Any]], prefix: str) -> dict[str, float]:
        a = self.args
        n_gen = int(a.num_generations_eval or a.num_generations)
        per_batch = max(1, (a.per_device_eval_batch_size * max(1, int(a.world_size))) // n_gen)
        self.sync_weights()
        with self._sampler_awake():  # one wake for the whole evaluation: level 2 discards vLLM's weights
            return self._evaluate_batches(rows, prefix, n_gen, per_batch)

    def _evaluate_batches(self, rows: list[dict[str, Any]], prefix: str, n_gen: int, per_batch: int) -> dict[str, float]:
        a = self.args
        has_prompt = check_columns(rows, self.prompt_column, "eval_dataset")
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for start in range(0, len(rows), per_batch):
            chunk = rows[start: start + per_batch][int(a.process_index):: max(1, int(a.world_size))]
            prompts = [make_prompt(r, self.processing_class, has_prompt, self.prompt_column, a.max_prompt_length,
                                   self.system_prompt) for r in chunk]
            if not prompts and world()[1] == 1:
                continue
            # data-parallel: a rank whose share of the last chunk is empty still joins the gathers
            trajs = (self.rollout(prompts, num_generations=n_gen) if n_gen != a.num_generations
                     else self.rollout(prompts)) if prompts else []
            adv, columns, stats = self._score(trajs)
            metrics = rollout_metrics(self.whole_batch.trajectories, self.whole_batch.columns, stats.zero_std_frac)
            metrics.update(self._reward_errors)
            for k, v in self._pending_reward_metrics.items():
                metrics[k] = sum(v) / len(v) if v else float("nan")
            self._pending_reward_metrics = {}
            adv_list = advantage_list(adv)
            if a.log_completions:  # every rank's eval completions, as in training
                self._log_completions(self.whole_batch.trajectories, self.whole_advantages, prefix,
                                      extras_from=self.whole_batch.start)
            self._pending_reward_extras = {}
            forward: dict[str, float] = {}
            weights: dict[str, float] = {}
            if trajs:
                batch = pad_to_multiple(pack(trajs, adv_list, self.pad_token_id, device=a.device), self._pad_multiple,
                                        self.pad_token_id)
                tokens = float(batch.completion_mask.sum())
                if self.teacher_model is not None:  # on-policy distillation's term in the eval loss too
                    batch.teacher_logps = self._logps_in_chunks(self.teacher_model, batch, max(1, a.per_device_train_batch_size))
                with torch.no_grad():
                    forward["loss"] = float(self.compute_loss(self.model, {"batch": batch, "num_items": tokens}))
                forward.update(self._train_metrics.pop())  # entropy, clip ratios … of the eval forward pass
                # data-parallel: ranks combine into the whole batch's value, weighted by what each
                # value is a mean over (token-normalised losses: tokens; per-sequence ones: sequences)
                sequences = float(batch.completion_mask.shape[0])  # per-sequence losses average over every row
                weights = {k: tokens for k in forward}
                if a.loss_type not in TOKEN_NORMALISED:
                    weights["loss"] = sequences
            metrics.update(weighted_mean_over_ranks(forward, weights))
            metrics["num_tokens"] = float(self.state.num_input_tokens_seen)
            for k, v in metrics.items():
                if v is None or (isinstance(v, float) and math.isnan(v)):
                    continue
                sums[k] = sums.get(k, 0.0) + float(v)
                counts[k] = counts.get(k, 0) + 1
        return {f"{prefix}_{k}": sums[k] / counts[k] for k in sums}

    @torch.no_grad()
    def _attach_logps(self, batch: Batch) -> None:
        """Old logprobs (policy at rollout time) when the policy moves before the batch is used up,
        or when IS correction needs trainer logprobs of the rollout policy; reference logprobs for KL."""
        a = self.args
        # TRL: the policy moves before the batch is used up when it spans several optimizer steps
        need_old = a.num_iterations > 1 or int(a.steps_per_generation) > a.gradient_accumulation_steps or a.is_correction is not None
        mb = max(1, a.per_device_train_batch_size)
        if need_old:
            was = self.model.training
            self.model.eval()
            batch.old_logps = self._logps_in_chunks(self.model, batch, mb)
            self.model.train(was)
        if a.beta != 0.0:
            if self.ref_model is not None:
                batch.ref_logps = self._logps_in_chunks(self.ref_model, batch, mb)
            else:  # LoRA: the base model is the reference
                with self.accelerator.unwrap_model(self.model).disable_adapter():
                    batch.ref_logps = self._logps_in_chunks(self.model, batch, mb)
        if self.teacher_model is not None:  # on-policy distillation: the teacher's logprobs of the sampled tokens
            batch.teacher_logps = self._logps_in_chunks(self.teacher_model, batch, mb)

    def _logps_in_chunks(self, model: Any, batch: Batch, size: int) -> torch.Tensor:
        return batch_logprobs(model, batch, temperature=self.args.temperature, chunk_size=self.args.logprob_chunk_size,
                              rows_per_pass=size, padding_free=self.padding_free)

    def _micro_batches(self, batch: Batch) -> list[dict[str, Any]]:
        """``num_iterations`` shuffled passes, each cut into ``steps_per_generation`` micro-batches
        (TRL's split). Token-level losses (dapo, cispo, vespo) divide by TRL's normaliser: the
        generation batch's active tokens × gradient_accumulation_steps / steps_per_generation; each
        micro-batch carries that divided by gradient_accumulation_steps (compute_loss divides by it)."""
        a = self.args
        spg = int(a.steps_per_generation)
        out: list[dict[str, Any]] = []
        gen = torch.Generator().manual_seed(int(a.seed) * 7919 + self._generations)
        # data-parallel: the whole batch's active tokens over the ranks (gradient averaging divides
        # by the ranks again), so every rank's loss has one process's normaliser (TRL's)
        ranks = world()[1]
        num_items = all_sum(float(batch.completion_mask.sum().cpu())) / ranks / spg
        for _ in range(a.num_iterations):
            order = torch.randperm(batch.size, generator=gen)
            for c in torch.tensor_split(order, spg):
                out.append({"batch": batch.select(c.to(batch.input_ids.device)), "num_items": num_items})
        return out

    # --- the loss ----------------------------------------------------------------------------------
    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        b: Batch = inputs["batch"]
        ga = self.current_gradient_accumulation_steps if self.model.training else 1
        loss, metrics = batch_loss(  # the loss step of rlcore.loop.Policy.forward_backward, shared
            model, b, self.loss_fn, LossConfig.from_args(self.args, num_items=inputs.get("num_items")),
            temperature=self.args.temperature, chunk_size=self.args.logprob_chunk_size,
            top_entropy_quantile=self.args.top_entropy_quantile, use_sampler_logps=bool(self.args.is_correction),
            entropy_bonus=self.entropy_bonus,
            router_aux=self.router_aux, padding_free=self.padding_free,
        )
        self._entropy_boundary()
        if not metrics:  # nothing to train on in this micro-batch
            return (loss, None) if return_outputs else loss
        self._train_metrics.add(metrics)
        loss = loss / ga
        return (loss, None) if return_outputs else loss

    def _entropy_boundary(self) -> None:
        """TRL's entropy control at an optimizer-step boundary (the last micro-batch of an
        accumulation window, in train mode): the adaptive coefficient moves on the window's
        world-mean entropy, and ``entropy_coef`` is logged (static or adaptive)."""
        bonus = self.entropy_bonus
        if bonus is None or not self.model.training or not self.accelerator.sync_gradients:
            return
        bonus.step(reduce=sum_over_ranks)  # the world-mean entropy (every rank alike)
        self._train_metrics.add({"entropy_coef": bonus.coef})

    # --- logging -----------------------------------------------------------------------------------
    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs and "train_runtime" not in logs:
            now = time.perf_counter()
            if self._last_log_time is None:  # first log of this process (also after a resume)
                steps = max(1, min(self.state.global_step, int(self.args.logging_steps)))
                elapsed = now - getattr(self, "_train_start", now)
            else:
                steps = max(1, self.state.global_step - self._last_logged_step)
                elapsed = now - self._last_log_time
            train = mean_over_ranks(self._train_metrics.pop())  # data-parallel: the run's, not one rank's
            rollout_time = self._rollout_time
            record: dict[str, Any] = {"step": self.state.global_step}
            record.update(self._gen_metrics)
            record.update(train)
            record.update(logs)
            record.pop("rollout_only_time", None)
            record["step_time"] = elapsed / steps
            record["rollout_time"] = rollout_time / steps
            record["train_time"] = max(0.0, elapsed - rollout_time) / steps
            record["tokens_per_second"] = self._sampled_tokens / elapsed if elapsed > 0 else 0.0
            for key in ("clip_ratio/low", "clip_ratio/high", "kl", "entropy"):
                record.setdefault(key, 0.0)
            self._rollout_time = 0.0
            self._sampled_tokens = 0.0
            self._last_log_time = now
            self._last_logged_step = self.state.global_step
            if self.args.should_save:
                append_jsonl(self.args.output_dir, record)
            logs = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
        super().log(logs, *args, **kwargs)

    # --- train, checkpoints, resume ------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        """``Trainer.train`` plus rlcore's state on resume, plots at the end and on Ctrl-C."""
        path = None
        if self.args.should_save:  # nothing written while another run lives there, nothing through a link
            ckpt.check_not_in_use(self.args.output_dir)
            ckpt.check_no_links(self.args.output_dir)
        if resume_from_checkpoint:
            # a missing, foreign or damaged checkpoint is one line here, before anything is written
            path = ckpt.resolve_resume(resume_from_checkpoint, self.args.output_dir,
                                       self.args.resume_without_optimizer_state)
        if self.args.should_save:  # one live run per directory: held until train() returns (or the process ends)
            ckpt.acquire_run_lock(self.args.output_dir)
        try:
            if resume_from_checkpoint:
                ckpt.clean_incomplete(self.args.output_dir)
                self._load_rlcore_state(path)
            elif self.args.should_save:  # a fresh run never writes into another run's directory (the main process checks)
                ckpt.check_fresh_output_dir(self.args.output_dir, self.args.overwrite_output_dir)
                ckpt.clear_previous_run(self.args.output_dir)
                self.run_id = ckpt.new_run_id()
                ckpt.write_run_id(self.args.output_dir, self.run_id)
        except BaseException:
            self._release_run_lock()
            raise
        self._train_start = time.perf_counter()
        try:
            return super().train(resume_from_checkpoint=path, **kwargs)
        finally:
            if self.progress_callback is not None:
                self.progress_callback.stop()
            if self.args.plots and self.args.should_save:
                self._write_plots()
            self._release_run_lock()

    def _release_run_lock(self) -> None:
        if self.args.should_save:
            ckpt.release_run_lock(self.args.output_dir)

    def _write_plots(self) -> None:
        """The PNG plots, a courtesy: a failure to draw or write them is one warning line, never an
        error that costs the final model or hides the error a run stopped with."""
        try:
            self.plot_paths = write_plots(self.args.output_dir, max_completion_length=self.args.max_completion_length)
        except Exception as exc:  # noqa: BLE001 - any plotting fault; the run's outcome stands
            self.plot_paths = []
            logger.warning("could not write the plots to %s: %s: %s (the run is unaffected; metrics.jsonl has every value)",
                           os.path.join(self.args.output_dir, "plots"), type(exc).__name__, exc)

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """A tied head (``lm_head.weight`` is ``embed_tokens.weight``) is not written into a checkpoint,
        and transformers then warned ``There were missing keys in the checkpoint model loaded:
        ['lm_head.weight']`` on every resume of such a model, though nothing was missing. Parameters
        that share their tensor with a loaded one are left out of the warning (and re-tied)."""
        model = self.accelerator.unwrap_model(self.model)
        missing = set(load_result.missing_keys)
        names: dict[int, list[str]] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(name)
        tied = {n for group in names.values() if not set(group) <= missing for n in group if n in missing}
        if tied and hasattr(load_result, "_replace"):
            model.tie_weights()
            load_result = load_result._replace(missing_keys=[k for k in load_result.missing_keys if k not in tied])
        super()._issue_warnings_after_load(load_result)

    def _load_rlcore_state(self, path: str) -> None:
        state, buffer = ckpt.read_state(path)
        self.run_id = ckpt.check_owner(path, state, self.args.output_dir) or ckpt.new_run_id()
        if self.args.should_save and ckpt.read_run_id(self.args.output_dir) is None:
            ckpt.write_run_id(self.args.output_dir, self.run_id)  # this directory now continues that run
        if state.get("sampler_rng") is not None and hasattr(self.sampler, "set_rng_state"):
            self.sampler.set_rng_state(state["sampler_rng"])
        if "cursor" in state:
            self.cursor.load_state_dict(state["cursor"])
        if (state.get("prompt_sampler") or {}).get("name") == self.args.prompt_sampler:
            self.prompt_sampler.load_state_dict(state["prompt_sampler"]["state"])
        self._generations = int(state.get("generations", 0))
        self._gen_metrics = dict(state.get("gen_metrics", {}))
        if state.get("dynamic_sampling") is not None:
            self._ds_streak = {**_fresh_streak(), **state["dynamic_sampling"]}
        if self.entropy_bonus is not None and self.entropy_bonus.adaptive and state.get("entropy_control") is not None:
            self.entropy_bonus.load_state_dict(state["entropy_control"])
        self._buffer = [dict(mb, batch=mb["batch"].to(self.args.device)) for mb in (buffer or [])]
        step = int(state.get("global_step", 0))
        truncate_jsonl(self.args.output_dir, step)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Write the checkpoint in a hidden temp dir, add rlcore's state, then rename it into place."""
        run_dir = self._get_output_dir(trial=trial)
        folder = f"checkpoint-{self.state.global_step}"
        # a failed save removes its partial checkpoint; no room to write it is one line (StorageError)
        with ckpt.saving(run_dir, self.state.global_step) as tmp:
            original = self._get_output_dir
            self._get_output_dir = lambda trial=None: tmp  # type: ignore[method-assign]
            try:
                super()._save_checkpoint(model, trial)
            finally:
                self._get_output_dir = original  # type: ignore[method-assign]
            state = {
                "global_step": self.state.global_step,
                "cursor": self.cursor.state_dict(),
                "prompt_sampler": {"name": self.args.prompt_sampler, "state": self.prompt_sampler.state_dict()},
                "generations": self._generations,
                "gen_metrics": self._gen_metrics,
                "dynamic_sampling": self._ds_streak if self.args.dynamic_sampling else None,
                "run_id": getattr(self, "run_id", None),
                "sampler_rng": self.sampler.rng_state() if hasattr(self.sampler, "rng_state") else None,
                # TRL's entropy_ctrl_state.json: the adaptive coefficient and the last measured entropy
                "entropy_control": self.entropy_bonus.state_dict() if self.entropy_bonus is not None and self.entropy_bonus.adaptive else None,
            }
            buffer = [dict(mb, batch=mb["batch"].to("cpu")) for mb in self._buffer]
            ckpt.write_state(os.path.join(tmp, folder), state, buffer)
            final = ckpt.publish(tmp, run_dir, folder)
        if self.state.best_model_checkpoint and os.path.basename(self.state.best_model_checkpoint) == folder:
            self.state.best_model_checkpoint = final
        if self.args.should_save:
            from transformers.trainer_utils import rotate_checkpoints

            rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)
