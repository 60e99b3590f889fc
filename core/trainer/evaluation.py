"""Evaluation as TRL does it for GRPO: roll out every eval prompt ``num_generations_eval`` times
with the current policy, score with the training rewards, and report TRL's keys under the prefix
(``eval_reward``, ``eval_rewards/<f>/mean``, ``eval_completions/mean_length`` …) plus the loss
of one forward pass over the batch (``eval_loss``)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..algorithms.losses import TOKEN_NORMALISED
from ..data.cursor import as_rows, check_columns, make_prompt
from ..errors import ConfigError
from ..loop.loss import pack, pad_to_multiple
from ..training.data_parallel import weighted_mean_over_ranks, world
from ..training.metrics import MetricAccumulator, append_jsonl
from .completions import log_completions
from .scored import Rollout


def eval_row_sets(eval_dataset: Any) -> dict[str, list[dict[str, Any]]]:
    """TRL's eval_dataset: one dataset ("" names it) or a dict name -> dataset (metrics get the name)."""
    if eval_dataset is None:
        return {}
    if isinstance(eval_dataset, dict):
        return {str(k): as_rows(v) for k, v in eval_dataset.items()}
    return {"": as_rows(eval_dataset)}


def evaluate(trainer: Any, sets: dict[str, list[dict[str, Any]]], metric_key_prefix: str) -> dict[str, float]:
    """Every eval set's metrics (``{prefix}_{name}_…`` for a named set), the module in eval mode and
    the training metrics set aside meanwhile; appended to metrics.jsonl, logged, and the callbacks'
    ``on_evaluate`` called."""
    if not sets:
        raise ConfigError("evaluation needs an eval_dataset (pass eval_dataset= to GRPOTrainer)")
    out: dict[str, float] = {}
    train_metrics, trainer._train_metrics = trainer._train_metrics, MetricAccumulator()
    was_training = trainer.model.training
    trainer.model.eval()
    try:
        for name, rows in sets.items():
            prefix = f"{metric_key_prefix}_{name}" if name else metric_key_prefix
            a = trainer.args
            n_gen = int(a.num_generations_eval or a.num_generations)
            per_batch = max(1, (a.per_device_eval_batch_size * max(1, int(a.world_size))) // n_gen)
            trainer.sync_weights()
            with trainer._sampler_awake():  # one wake for the whole evaluation: level 2 discards vLLM's weights
                out.update(evaluate_rows(trainer, rows, prefix, n_gen, per_batch))
    finally:
        trainer.model.train(was_training)
        trainer._train_metrics = train_metrics
    if trainer.args.should_save:
        append_jsonl(trainer.args.output_dir, {"step": trainer.state.global_step, **out})
    trainer.log(out)
    trainer.control = trainer.callback_handler.on_evaluate(trainer.args, trainer.state, trainer.control, out)
    return out


def evaluate_rows(trainer: Any, rows: list[dict[str, Any]], prefix: str, n_gen: int, per_batch: int) -> dict[str, float]:
    """One eval set in chunks of ``per_batch`` prompts (each rank its share): the mean over the
    chunks of each metric a chunk reported (NaN ones left out)."""
    a = trainer.args
    has_prompt = check_columns(rows, trainer.prompt_column, "eval_dataset")
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for start in range(0, len(rows), per_batch):
        chunk = rows[start: start + per_batch][int(a.process_index):: max(1, int(a.world_size))]
        prompts = [make_prompt(r, trainer.processing_class, has_prompt, trainer.prompt_column, a.max_prompt_length,
                               trainer.system_prompt) for r in chunk]
        if not prompts and world()[1] == 1:
            continue
        # data-parallel: a rank whose share of the last chunk is empty still joins the gathers
        trajs = (trainer.rollout(prompts, num_generations=n_gen) if n_gen != a.num_generations
                 else trainer.rollout(prompts)) if prompts else Rollout()
        scored = trainer._score(trajs)
        metrics = scored.metrics()
        metrics.update(trainer.reward_log.pop_metrics())
        if a.log_completions:  # every rank's eval completions, as in training
            log_completions(a, trainer.state.global_step, scored.whole.trajectories, scored.whole_advantages,
                            prefix=prefix, extras=trainer.completion_extras, extras_from=scored.whole.start)
        trainer.reward_log.pop_extras()
        metrics.update(_forward_metrics(trainer, scored) if len(trajs) else weighted_mean_over_ranks({}, {}))
        metrics["num_tokens"] = float(trainer.state.num_input_tokens_seen)
        for k, v in metrics.items():
            if v is None or (isinstance(v, float) and math.isnan(v)):
                continue
            sums[k] = sums.get(k, 0.0) + float(v)
            counts[k] = counts.get(k, 0) + 1
    return {f"{prefix}_{k}": sums[k] / counts[k] for k in sums}


def _forward_metrics(trainer: Any, scored: Any) -> dict[str, float]:
    """The loss (and entropy, clip ratios …) of one no-grad forward over this rank's eval batch,
    combined over the ranks into the whole batch's value, weighted by what each value is a mean
    over (token-normalised losses: tokens; per-sequence ones: sequences)."""
    a = trainer.args
    batch = pad_to_multiple(pack(scored.trajectories, scored.advantages, trainer.pad_token_id, device=a.device),
                            trainer._pad_multiple, trainer.pad_token_id)
    tokens = float(batch.completion_mask.sum())
    if trainer.teacher_model is not None:  # on-policy distillation's term in the eval loss too
        batch.teacher_logps = trainer._logps_in_chunks(trainer.teacher_model, batch, max(1, a.per_device_train_batch_size))
    forward: dict[str, float] = {}
    with torch.no_grad():
        forward["loss"] = float(trainer.compute_loss(trainer.model, {"batch": batch, "num_items": tokens}))
    forward.update(trainer._train_metrics.pop())  # entropy, clip ratios … of the eval forward pass
    sequences = float(batch.completion_mask.shape[0])  # per-sequence losses average over every row
    weights = {k: tokens for k in forward}
    if a.loss_type not in TOKEN_NORMALISED:
        weights["loss"] = sequences
    return weighted_mean_over_ranks(forward, weights)
