"""From a scored generation batch to what the Trainer's micro-steps take: the packed
:class:`~rlcore.types.Batch` (:func:`train_batch`) with the logprobs the loss needs beside the
sampled ones (:func:`attach_logps`), then ``num_iterations`` shuffled passes cut into micro-batches
(:func:`micro_batches`), or micro-batches that skip their step (:func:`skipped_micro_batches`)."""

from __future__ import annotations

from typing import Any

import torch

from ..loop.loss import pack, pad_to_multiple
from ..training.data_parallel import all_sum, world
from ..types import Batch


def train_batch(trainer: Any, scored: Any) -> Batch | None:
    """This rank's share of ``scored`` packed (failed and, with ``mask_truncated_completions``,
    truncated trajectories do not train), padded to ``pad_to_multiple_of``, with the logprobs the
    loss needs (``trainer._attach_logps``); None when dynamic sampling skips the step."""
    if scored.skips_step:
        return None
    batch = pack(scored.trajectories, scored.advantages, trainer.pad_token_id,
                 mask_truncated=trainer.args.mask_truncated_completions, device=trainer.args.device)
    batch = pad_to_multiple(batch, trainer._pad_multiple, trainer.pad_token_id)
    if batch.size:  # a rank whose share of a short dynamic-sampling batch is empty has nothing to score
        trainer._attach_logps(batch)
    return batch


@torch.no_grad()
def attach_logps(trainer: Any, batch: Batch) -> None:
    """Old logprobs (policy at rollout time) when the policy moves before the batch is used up,
    or when IS correction needs trainer logprobs of the rollout policy; reference logprobs for KL;
    the teacher's for on-policy distillation. Each through ``trainer._logps_in_chunks``."""
    a = trainer.args
    # TRL: the policy moves before the batch is used up when it spans several optimizer steps
    need_old = a.num_iterations > 1 or int(a.steps_per_generation) > a.gradient_accumulation_steps or a.is_correction is not None
    mb = max(1, a.per_device_train_batch_size)
    if need_old:
        was = trainer.model.training
        trainer.model.eval()
        batch.old_logps = trainer._logps_in_chunks(trainer.model, batch, mb)
        trainer.model.train(was)
    if a.beta != 0.0:
        if trainer.ref_model is not None:
            batch.ref_logps = trainer._logps_in_chunks(trainer.ref_model, batch, mb)
        else:  # LoRA: the base model is the reference
            with trainer.accelerator.unwrap_model(trainer.model).disable_adapter():
                batch.ref_logps = trainer._logps_in_chunks(trainer.model, batch, mb)
    if trainer.teacher_model is not None:  # on-policy distillation: the teacher's logprobs of the sampled tokens
        batch.teacher_logps = trainer._logps_in_chunks(trainer.teacher_model, batch, mb)


def micro_batches(batch: Batch, args: Any, generations: int) -> list[dict[str, Any]]:
    """``num_iterations`` shuffled passes (seeded by the run's seed and the generation count), each
    cut into ``steps_per_generation`` micro-batches (TRL's split). Token-level losses (dapo, cispo,
    vespo) divide by TRL's normaliser: the generation batch's active tokens ×
    gradient_accumulation_steps / steps_per_generation; each micro-batch carries that divided by
    gradient_accumulation_steps (compute_loss divides by it)."""
    spg = int(args.steps_per_generation)
    out: list[dict[str, Any]] = []
    gen = torch.Generator().manual_seed(int(args.seed) * 7919 + generations)
    # data-parallel: the whole batch's active tokens over the ranks (gradient averaging divides
    # by the ranks again), so every rank's loss has one process's normaliser (TRL's)
    num_items = all_sum(float(batch.completion_mask.sum().cpu())) / world()[1] / spg
    for _ in range(args.num_iterations):
        order = torch.randperm(batch.size, generator=gen)
        for c in torch.tensor_split(order, spg):
            out.append({"batch": batch.select(c.to(batch.input_ids.device)), "num_items": num_items})
    return out


def skipped_micro_batches(n: int, pad_token_id: int, device: Any) -> list[dict[str, Any]]:
    """``n`` micro-batches of a step that trains on nothing (``training_step`` skips each)."""
    empty = pack([], [], pad_token_id, device=device)
    return [{"batch": empty, "num_items": 0.0, "skip": True} for _ in range(n)]
