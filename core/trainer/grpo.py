"""``GRPOTrainer``: GRPO-family RL as a ``transformers.Trainer`` subclass.

Why a Trainer subclass: accelerate, mixed precision, gradient accumulation, ``report_to``,
``save_steps`` and ``resume_from_checkpoint`` then work exactly as transformers users expect. We
slot RL into it the way TRL does: the Trainer's micro-steps pull from a buffer of mini-batches; when
the buffer is empty one *generation step* (:meth:`GRPOTrainer._generate_and_score`) refills it:

1. sync weights to the sampler (the colocated ``hf`` sampler shares the module: nothing to copy),
2. roll out ``num_generations`` trajectories per prompt through the chosen scheduler,
3. score them with every reward (weighted) and turn rewards into advantages (the chosen estimator):
   a :class:`~rlcore.trainer.scored.ScoredBatch`,
4. record old logprobs when the policy will move before the batch is used up (μ>1 or several
   optimizer steps per generation) and reference logprobs when ``beta`` > 0,
5. cut ``num_iterations`` shuffled passes into micro-batches.

``compute_loss`` then scores one micro-batch with chunked logprobs and the chosen loss plugin.
Beside this module: :mod:`.construction` (TRL's arguments, the models), :mod:`.scored` (scoring),
:mod:`.batches` (micro-batches), :mod:`.resampling` (dynamic sampling), :mod:`.evaluation`,
:mod:`.completions` (completion logs) and :mod:`.run_state` (checkpoints, the output directory, plots).
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Sequence

import torch
from transformers import Trainer
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..algorithms.losses import LossConfig
from ..data.cursor import PromptCursor, make_prompt
from ..loop.loss import batch_logprobs, batch_loss, high_entropy_mask
from ..loop.rollouts import rollout_batch
from ..loop.sync import sync_weights as sync_policy_weights
from ..rewards import RewardContext
from ..training.components import sampling_params
from ..training.config import GRPOConfig
from ..training.data_parallel import gather_objects, mean_over_ranks, sum_over_ranks, whole_batch
from ..training.dynamic_sampling import check_metric as check_dynamic_sampling_metric
from ..training.health import RunHealth
from ..training.metrics import MetricAccumulator, StepClock, append_jsonl, step_record
from ..training.prompt_sampler import make_prompt_sampler
from ..training.step_progress import RichProgressCallback
from ..types import Batch, Trajectory
from . import run_state
from .batches import attach_logps, micro_batches, skipped_micro_batches, train_batch
from .completions import log_completions
from .construction import StepCounter, check_inputs, load_models, make_components, place_components
from .evaluation import eval_row_sets, evaluate
from .resampling import SkipStreak, dynamic_sampling_rounds
from .scored import RewardLog, Rollout, ScoredBatch, estimate_advantages, score_rewards

__all__ = ["GRPOConfig", "GRPOTrainer", "high_entropy_mask"]


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
        tools / environment_factory / rollout_func: TRL's agent arguments (:class:`.construction.TRLAgent`).
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
        inputs = check_inputs(args, reward_funcs, train_dataset, eval_dataset, processing_class, tools=tools,
                              rollout_func=rollout_func, environment_factory=environment_factory, scheduler=scheduler,
                              prompt_column=prompt_column)
        args = inputs.args
        self.rows, self.has_prompt, self.eval_rows, self.agent = inputs.rows, inputs.has_prompt, inputs.eval_rows, inputs.agent
        self.prompt_column, self.system_prompt = prompt_column, system_prompt
        m = load_models(model, args, inputs.processing_class, quantization_config, peft_config)
        self.multi_turn_note, self.router_aux, self.ref_model, self.teacher_model = \
            m.multi_turn_note, m.router_aux, m.ref_model, m.teacher_model
        c = make_components(inputs, reward_processing_classes)
        self.reward_objects, self.reward_weights, self.advantage, self.loss_fn, self.entropy_bonus = \
            c.rewards, c.reward_weights, c.advantage, c.loss_fn, c.entropy_bonus
        super().__init__(model=m.model, args=args, train_dataset=None, eval_dataset=inputs.eval_dataset,
                         processing_class=m.tokenizer, callbacks=callbacks, optimizers=optimizers, **kwargs)
        place_components(self, sampler, scheduler)  # sampler, scheduler, devices, padding-free checks

        # --- run state ---------------------------------------------------------------------------------
        self.cursor = PromptCursor(len(self.rows), seed=args.seed, shuffle=args.shuffle_dataset)
        # which rows each generation draws (prompt_sampler: uniform = the cursor as it is)
        self.prompt_sampler = make_prompt_sampler(args.prompt_sampler, self.cursor, args.prompt_sampler_options)
        self._prompt_rows: dict[str, int] = {}  # group id of a drawn prompt -> its row, until scored
        self.skip_streak = SkipStreak()  # dynamic sampling: steps in a row with too few groups with spread
        self._skipped_micro_step = False
        if args.dynamic_sampling:
            check_dynamic_sampling_metric(args.dynamic_sampling_metric, [r.name for r in self.reward_objects])
        self._buffer: list[dict[str, Any]] = []
        self._train_metrics = MetricAccumulator()
        self._gen_metrics: dict[str, float] = {}
        self.clock = StepClock()
        self._generations = 0
        self.health = RunHealth(args.failure_threshold, args.failure_patience)
        self.reward_log = RewardLog()  # what rewards log (TRL's log_metric / log_extra) until a step takes it
        self.completion_extras: dict[str, list[Any]] = {}  # the last training generation's log_extra columns
        self._reported_reward_errors: set[str] = set()
        #: the last generation step's trained batch (every rank's) and the last rollout taken, for
        #: callbacks and tests; the step reads neither back
        self.whole_batch: Any = None
        self.last_rollout: Rollout | None = None
        self.plot_paths: list[str] = []
        self.run_id: str | None = None
        self.progress_callback = None if args.disable_tqdm else RichProgressCallback()
        if self.progress_callback is not None:
            self.remove_callback(ProgressCallback)
            self.remove_callback(PrinterCallback)
            self.add_callback(self.progress_callback)

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
        """One item per micro-step of one pass over the prompts, as TRL's dataloader is long, so the
        Trainer's ``epoch`` (logged, and what ``eval_strategy``/``save_strategy="epoch"`` count) is a
        pass over the dataset as on TRL; ``max_steps`` runs through as many passes as it needs."""
        gens_per_epoch = max(1, math.ceil(len(self.rows) / self.args.prompts_per_generation))
        n = gens_per_epoch * self.micro_steps_per_generation
        accum = max(1, int(self.args.gradient_accumulation_steps))
        n = math.ceil(n / accum) * accum  # whole optimizer steps: no short accumulation at a pass's end
        return torch.utils.data.DataLoader(StepCounter(n), batch_size=1, collate_fn=lambda items: {"micro_step": items})

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        if not self.model.training or "batch" in inputs:  # evaluation is not GRPO's; training_step took it first
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

    # --- rollout ---------------------------------------------------------------------------------------
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

    def _sampler_awake(self) -> Any:
        """With ``sleep_sampler``: the sampler awake for a generation phase (:class:`.construction.SamplerSleep`)."""
        return self.sampler_sleep.awake()

    def rollout(self, prompts: Sequence[Any], num_generations: int | None = None) -> Rollout:
        """Roll out ``prompts`` through the scheduler (the module in eval mode) and hold the batch to
        the rollout invariants; a violation fails that trajectory and is counted in the Rollout."""
        was_training = self.model.training
        self.model.eval()
        try:
            with self._sampler_awake():
                return self._take_rollout(self._run_rollouts(prompts, num_generations))
        finally:
            self.model.train(was_training)

    def _take_rollout(self, result: Any) -> Rollout:
        """A finished batch (the result of :meth:`_run_rollouts`) as a Rollout with its invariant counts."""
        self.last_rollout = Rollout(result.trajectories, result.stats["invariant_violations"],
                                    result.stats["invariant_check_s"])
        return self.last_rollout

    @property
    def _invariant_failures(self) -> int:
        """The last rollout's invariant violations (each step counts its own rollouts')."""
        return self.last_rollout.invariant_violations if self.last_rollout is not None else 0

    def _run_rollouts(self, prompts: Sequence[Any], num_generations: int | None = None) -> Any:
        """One batch through the run's scheduler and the invariant check (:func:`rlcore.loop.rollout_batch`),
        no module mode changed and no run state written (the Ray trainer's prefetch calls it too)."""
        return rollout_batch(
            self.scheduler_obj, list(prompts), num_generations=num_generations or self.args.num_generations,
            sampling_params=sampling_params(self.args), observers=tuple(self.args.observers or ()),
            concurrency=self.args.rollout_concurrency, timeout=self.args.rollout_timeout,
            tokenizer=self.processing_class,
        )

    def _rollout_refill(self, prompts: Sequence[Any]) -> Rollout:
        """A dynamic-sampling refill round: rolled out now, with the current policy."""
        return self.rollout(prompts)

    def _rounds_done(self) -> None:
        """Called when a step's dynamic-sampling rounds are over (the Ray trainer starts its prefetch)."""

    # --- scoring -------------------------------------------------------------------------------------
    def _score(self, trajs: Sequence[Trajectory]) -> ScoredBatch:
        """Score a rollout with every reward, then the estimator over every rank's batch (data-parallel:
        batch statistics as one process would compute them); this rank keeps its slice."""
        rollout = Rollout.of(trajs)
        columns, errors = self._reward_columns(rollout)
        whole = whole_batch(rollout, columns)
        advantages, stats = self._advantages(whole)
        return ScoredBatch(rollout, whole.local(advantages), columns, whole, advantages, stats, errors,
                           rollout.invariant_violations, rollout.invariant_check_s)

    def _reward_columns(self, trajs: Sequence[Trajectory]) -> tuple[dict[str, list[float | None]], dict[str, float]]:
        """Every reward on ``trajs`` (:func:`.scored.score_rewards`): the columns and the reward errors."""
        context = RewardContext(trainer_state=self.state, log_metric=self.reward_log.log_metric,
                                log_extra=self.reward_log.log_extra,
                                environment_of=getattr(self.scheduler_obj, "environment_for", None))
        return score_rewards(trajs, self.reward_objects, self.reward_weights, context=context,
                             observers=self.args.observers or (), reported=self._reported_reward_errors)

    def _advantages(self, whole: Any) -> tuple[list[Any], Any]:
        """The chosen estimator over ``whole`` (every rank's trajectories): advantages and stats."""
        return estimate_advantages(self.advantage, whole, self.args, self.reward_weights)

    # --- one generation step -------------------------------------------------------------------------
    def _generate_and_score(self) -> list[dict[str, Any]]:
        """Sync, roll out, score (dynamic sampling: in rounds), attach logprobs, record the step's
        metrics; the micro-batches of ``num_iterations`` passes (or skipped ones)."""
        a = self.args
        t0 = time.perf_counter()
        self.sync_weights()
        if a.dynamic_sampling:  # rounds of prompts until the batch's groups all have reward spread
            scored, t_rollout = dynamic_sampling_rounds(self)
        else:
            rollout = self.rollout(self._next_prompts())
            t_rollout = time.perf_counter() - t0
            scored = self._score(rollout)
            self._observe_prompts(rollout)
        self.whole_batch = whole = scored.whole
        batch = train_batch(self, scored)  # None: dynamic sampling skips this step
        # every rank's batch (every round's): metrics and the verdicts speak for the run
        self._gen_metrics = metrics = scored.step_metrics(self.prompt_sampler.metrics())
        ds = scored.sampling
        generated = scored.generated if scored.generated is not None else whole
        self.health.check(generated.trajectories)  # raises RunFailedError on a dead run (on every rank alike)
        if ds is not None:  # failure_patience skipped steps in a row: the run stops
            self.skip_streak.verdict(ds, metrics, a, self.state.global_step, [r.name for r in self.reward_objects])
        metrics.update(self.reward_log.pop_metrics())
        # a reward's log_extra columns line up with one rollout; dynamic sampling's batch is picked from several
        extras = self.reward_log.pop_extras()
        self.completion_extras = extras if ds is None else {}
        if a.log_completions and whole.trajectories:  # the trained batch
            log_completions(a, self.state.global_step, whole.trajectories, scored.whole_advantages,
                            extras=self.completion_extras, extras_from=whole.start)
        scheduler_metrics = getattr(self.scheduler_obj, "metrics", None)
        if callable(scheduler_metrics):  # e.g. openenv/* client counters (retries, timeouts, sessions)
            metrics.update({k: float(v) for k, v in scheduler_metrics().items()})
        self.clock.generated(time.perf_counter() - t0, metrics["sampled_tokens"])
        metrics["rollout_only_time"] = t_rollout
        if self.model.training:  # TRL's num_tokens: prompt + completion tokens seen so far (all ranks)
            seen = sum(len(t.prompt_ids) + len(t.completion_ids) for t in generated.trajectories)
            self.state.num_input_tokens_seen = int(getattr(self.state, "num_input_tokens_seen", 0) or 0) + seen
        metrics["num_tokens"] = float(self.state.num_input_tokens_seen)
        self._generations += 1
        if batch is None:  # too few groups with spread: this step trains on nothing (see training_step)
            return skipped_micro_batches(self.micro_steps_per_generation, self.pad_token_id, a.device)
        return micro_batches(batch, a, self._generations)

    def _attach_logps(self, batch: Batch) -> None:
        """Old, reference and teacher logprobs as the loss needs them (:func:`.batches.attach_logps`)."""
        attach_logps(self, batch)

    def _logps_in_chunks(self, model: Any, batch: Batch, size: int) -> torch.Tensor:
        return batch_logprobs(model, batch, temperature=self.args.temperature, chunk_size=self.args.logprob_chunk_size,
                              rows_per_pass=size, padding_free=self.padding_free)

    # --- the loss ----------------------------------------------------------------------------------
    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        b: Batch = inputs["batch"]
        ga = self.current_gradient_accumulation_steps if self.model.training else 1
        loss, metrics = batch_loss(  # the loss step of rlcore.loop.Policy.forward_backward, shared
            model, b, self.loss_fn, LossConfig.from_args(self.args, num_items=inputs.get("num_items")),
            temperature=self.args.temperature, chunk_size=self.args.logprob_chunk_size,
            top_entropy_quantile=self.args.top_entropy_quantile, use_sampler_logps=bool(self.args.is_correction),
            entropy_bonus=self.entropy_bonus, router_aux=self.router_aux, padding_free=self.padding_free,
        )
        self._entropy_boundary()
        if metrics:  # else nothing to train on in this micro-batch
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

    # --- logging and evaluation --------------------------------------------------------------------------
    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs and "train_runtime" not in logs:  # a training step's record (metrics.jsonl)
            times = self.clock.times(self.state.global_step, self.args.logging_steps)
            train = mean_over_ranks(self._train_metrics.pop())  # data-parallel: the run's, not one rank's
            record = step_record(self.state.global_step, self._gen_metrics, train, logs, times)
            if self.args.should_save:
                append_jsonl(self.args.output_dir, record)
            logs = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
        super().log(logs, *args, **kwargs)

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """Roll out every eval prompt ``num_generations_eval`` times with the current policy, score
        with the training rewards, and log TRL's keys under ``eval_`` (:mod:`.evaluation`)."""
        return evaluate(self, eval_row_sets(eval_dataset) if eval_dataset is not None else self.eval_rows,
                        metric_key_prefix)

    # --- train, checkpoints, resume ------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        """``Trainer.train`` plus rlcore's state on resume, plots at the end and on Ctrl-C."""
        path = run_state.begin_run(self, resume_from_checkpoint)
        self.clock.start()
        try:
            return super().train(resume_from_checkpoint=path, **kwargs)
        finally:
            if self.progress_callback is not None:
                self.progress_callback.stop()
            if self.args.plots and self.args.should_save:
                self.plot_paths = run_state.write_plots(self.args)
            run_state.end_run(self.args)

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """No missing-key warning for a tied head (:func:`.run_state.without_tied_keys`)."""
        super()._issue_warnings_after_load(run_state.without_tied_keys(self.accelerator.unwrap_model(self.model),
                                                                       load_result))

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Write the checkpoint in a hidden temp dir, add rlcore's state, then rename it into place."""
        run_state.save_checkpoint(self, trial, functools.partial(super()._save_checkpoint, model, trial))
