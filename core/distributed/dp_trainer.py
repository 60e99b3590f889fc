"""``RayGRPOTrainer``: the ordinary GRPOTrainer, made data-parallel and fed by remote samplers.

Everything the single-process trainer does (rollout, rewards, advantages, logprobs, loss,
checkpoints, metrics) is inherited unchanged, which is what makes a 1-trainer Ray run reproduce a
single-process run's numbers. What changes:

* prompts: as in the plain trainer, every rank draws the same seeded generation batch and keeps its
  own slice of prompts (whole groups, so group-relative advantages see complete groups);
* gradients: averaged over the ranks' process group (gloo on CPU, NCCL on GPU) once per
  optimizer step — by DDP when the model is DDP-wrapped (the chunked logprobs then go through the
  wrapper's forward), explicitly otherwise;
* weight sync: rank 0 exports the policy and pushes it to every sampler worker (object store);
  the other ranks wait at a barrier so nobody samples with stale weights (sync mode);
* checkpoints: only rank 0 writes them;
* async generation: the next step's rollouts run in a background thread while this step trains;
  groups older than ``max_staleness`` policy versions are dropped; IS correction against the
  sampler's logprobs is switched on (``token_truncate``) unless the config chose a mode.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Sequence

from ..algorithms.logprobs import is_data_parallel
from ..trainer.grpo import GRPOTrainer
from ..trainer.scored import Rollout
from ..training.data_parallel import allreduce_gradients  # noqa: F401 - one implementation, re-exported
from .staleness import filter_stale, staleness_metrics
from ..loop.sync import sync_weights


class RayGRPOTrainer(GRPOTrainer):
    """GRPOTrainer for one rank of a Ray trainer group; ``sampler`` is a RemoteSampler pool."""

    sleeps_sampler = False  # remote samplers hold their own GPUs (and may generate while this rank trains)

    def __init__(
        self,
        *args: Any,
        sync_every: int = 1,
        async_generation: bool = False,
        max_staleness: int = 1,
        weight_sync: str = "object_store",
        broadcast_backend: str = "gloo",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.sync_every = max(1, int(sync_every))
        self.async_generation = bool(async_generation)
        self.max_staleness = int(max_staleness)
        self._pending: concurrent.futures.Future | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._dist_metrics: dict[str, float] = {}
        self.weight_sync = weight_sync
        self.broadcast_backend = broadcast_backend

    # --- data parallel: this process's rank and the group size ---------------------------------------
    @property
    def rank(self) -> int:
        return int(self.args.process_index)

    @property
    def world(self) -> int:
        return int(self.args.world_size)

    # --- gradients ---------------------------------------------------------------------------------------
    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> Any:
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self._skipped_micro_step:  # a step dynamic sampling skipped: no gradient anywhere (every rank alike)
            return loss
        if self.world > 1 and self.accelerator.sync_gradients and not is_data_parallel(model):
            allreduce_gradients(self.model)  # DDP-wrapped models were already synced by DDP
        return loss

    # --- weight sync ---------------------------------------------------------------------------------
    def sync_weights(self) -> None:
        """Rank 0 pushes the policy to every sampler every ``sync_every`` steps; others wait for it."""
        import torch.distributed as dist

        step = int(self.state.global_step)
        if step % self.sync_every:
            return  # step 0 syncs too: the samplers may hold another run's (or a resumed run's) weights
        if self.rank == 0:
            if self.weight_sync == "broadcast" and getattr(self.sampler, "_broadcast", None) is None:
                self.sampler.setup_broadcast(self.broadcast_backend)
            metrics = sync_weights(self.accelerator.unwrap_model(self.model), self.sampler, version=step)
            self._dist_metrics.update(metrics)
        else:
            self.sampler.policy_version = step
        if dist.is_available() and dist.is_initialized() and self.world > 1:
            dist.barrier()

    # --- async generation ----------------------------------------------------------------------------
    def rollout(self, prompts: Sequence[Any], num_generations: int | None = None) -> Rollout:
        """Async generation: this step's batch is the one prefetched while the last step trained
        (groups older than ``max_staleness`` versions dropped), and the next one starts now. A
        rollout with its own ``num_generations`` (evaluation's) is synchronous."""
        if not self.async_generation or num_generations is not None:
            return super().rollout(prompts, num_generations)
        if self._pending is None:  # first step: nothing prefetched yet
            trajs = super().rollout(prompts)
            self._start_prefetch(self._next_prompts())
        else:
            t0 = time.perf_counter()
            trajs = self._take_rollout(self._pending.result())
            self._pending = None
            self._dist_metrics["async/wait_seconds"] = time.perf_counter() - t0
            self._start_prefetch(prompts)
        version = int(self.state.global_step)
        kept, dropped = filter_stale(trajs, version, self.max_staleness)
        self._dist_metrics.update(staleness_metrics(kept, dropped, version))
        return Rollout(kept, trajs.invariant_violations, trajs.invariant_check_s)

    def _start_prefetch(self, prompts: Sequence[Any]) -> None:
        """Prefetch ``prompts`` now, or — with dynamic sampling — once this step's refill rounds are
        over (they roll out now, with the current policy, on the same samplers)."""
        if self.args.dynamic_sampling:
            self._held_prompts = list(prompts)
        else:
            self._prefetch(prompts)

    def _rollout_refill(self, prompts: Sequence[Any]) -> Rollout:
        """A dynamic-sampling refill round: synchronous, whatever the async mode (the next step's
        batch is prefetched after the rounds)."""
        return GRPOTrainer.rollout(self, prompts)

    def _rounds_done(self) -> None:
        held, self._held_prompts = getattr(self, "_held_prompts", None), None
        if held is not None:
            self._prefetch(held)

    @property
    def optimizer_steps_per_generation(self) -> int:
        """How far ``global_step`` moves on one generation batch: ``steps_per_generation`` counts
        micro-steps (TRL's meaning), ``num_iterations`` passes, ``gradient_accumulation_steps``
        micro-steps per optimizer step."""
        a = self.args
        return max(1, int(a.steps_per_generation) * int(a.num_iterations) // max(1, int(a.gradient_accumulation_steps)))

    def _prefetch(self, prompts: Sequence[Any]) -> None:
        """Start rolling out ``prompts`` in a background thread (its own event loop) right now —
        unless this generation step is the run's last, when nobody would train on them."""
        max_steps = int(self.state.max_steps or 0)
        if max_steps and self.state.global_step + self.optimizer_steps_per_generation >= max_steps:
            return
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlcore-prefetch")
        self._pending = self._executor.submit(self._rollout_remote, list(prompts))

    def _rollout_remote(self, prompts: list[Any]) -> Any:
        """``GRPOTrainer.rollout`` without its eval()/train() toggling: the samplers are remote, and
        flipping the module's mode from this thread would race the training step on the main one.
        The result's counts become metrics when the main thread takes it (``_take_rollout``)."""
        return self._run_rollouts(prompts)

    def _finish_prefetch(self) -> None:
        if self._pending is not None:
            try:
                self._pending.result()
            except Exception:  # noqa: BLE001 - the run is over; a failed extra batch does not matter
                pass
            self._pending = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def train(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().train(*args, **kwargs)
        finally:
            self._finish_prefetch()

    # --- metrics and checkpoints -----------------------------------------------------------------------
    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs and "train_runtime" not in logs and self._dist_metrics:
            self._gen_metrics.update(self._dist_metrics)
            self._dist_metrics = {}
        super().log(logs, *args, **kwargs)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Rank 0 writes the checkpoint; the other ranks hold identical weights and skip it."""
        if self.args.should_save:
            super()._save_checkpoint(model, trial)
