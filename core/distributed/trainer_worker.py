"""The trainer actor: one rank of the data-parallel trainer group.

Each actor joins a torch.distributed process group (gloo on CPU, NCCL on GPU) and then runs an
ordinary :class:`~rlcore.distributed.dp_trainer.RayGRPOTrainer`; transformers/accelerate see the
initialised group and wrap the model in DDP, so gradients are all-reduced without any code here.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any


def config_fields(args: Any) -> dict[str, Any]:
    """The init fields of a GRPOConfig, to rebuild it inside a worker (where ``world_size`` differs).

    ``generation_batch_size`` is dropped and ``steps_per_generation`` kept, so the batch per device
    stays what the user asked for and the global batch scales with the number of trainers.
    """
    out = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
    out["generation_batch_size"] = None
    for k in list(out):
        v = out[k]
        if hasattr(v, "value") and type(v).__module__.startswith("transformers"):
            out[k] = v.value  # enums (IntervalStrategy …) travel as their values
    return out


class TrainerWorker:
    """Rank ``rank`` of ``world_size``. The driver calls: ``address`` (rank 0) → ``init_process_group``
    (all) → ``setup`` (all) → ``train`` (all, concurrently)."""

    def __init__(self, rank: int, world_size: int, device: str = "cpu", torch_threads: int = 1) -> None:
        import torch

        torch.set_num_threads(max(1, torch_threads))
        self.rank, self.world_size, self.device = rank, world_size, device
        self.trainer: Any = None
        self._progress = {"global_step": 0, "max_steps": 0}

    def address(self) -> tuple[str, int]:
        """Rank 0's host and a free port, for the group's rendezvous."""
        from .collective import free_port, node_ip

        return node_ip(), free_port()

    def init_process_group(self, master_addr: str, master_port: int, timeout_s: float = 300.0) -> str:
        import torch.distributed as dist

        backend = "nccl" if self.device == "gpu" else "gloo"
        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",  # Ray gives each GPU worker exactly one visible device
            LOCAL_WORLD_SIZE="1",
        )
        if not dist.is_initialized():
            dist.init_process_group(
                backend, rank=self.rank, world_size=self.world_size, timeout=datetime.timedelta(seconds=timeout_s)
            )
        return backend

    def setup(
        self,
        model: str,
        config: dict[str, Any],
        rows: list[dict[str, Any]],
        sampler: Any,
        *,
        reward_funcs: Any = None,
        scheduler: Any = None,
        prompt_column: str | None = None,
        system_prompt: str | None = None,
        sync_every: int = 1,
        async_generation: bool = False,
        max_staleness: int = 1,
        weight_sync: str = "object_store",
        broadcast_backend: str = "gloo",
    ) -> dict[str, Any]:
        """Build this rank's trainer. ``sampler`` is the RemoteSampler pool (shipped by pickle)."""
        from ..training.config import GRPOConfig
        from .dp_trainer import RayGRPOTrainer

        cfg = dict(config)
        if self.device == "cpu":
            cfg["use_cpu"] = True
        if async_generation and cfg.get("is_correction") is None:
            cfg["is_correction"] = "token_truncate"  # off-policy by design: correct with the sampler's logprobs
        cfg["disable_tqdm"] = True  # the driver shows progress
        args = GRPOConfig(**cfg)
        if hasattr(sampler, "sync_history"):
            sampler.sync_history = []  # this run's syncs only (the pickled pool carries the driver's)
        self.trainer = RayGRPOTrainer(
            model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=rows,
            sampler=sampler,
            scheduler=scheduler,
            prompt_column=prompt_column,
            system_prompt=system_prompt,
            sync_every=sync_every,
            async_generation=async_generation,
            max_staleness=max_staleness,
            weight_sync=weight_sync,
            broadcast_backend=broadcast_backend,
        )
        self.trainer.add_callback(_progress_probe(self._progress))
        return {"rank": self.rank, "world_size": int(args.world_size), "generation_batch_size": int(args.generation_batch_size)}

    def train(self, resume_from_checkpoint: Any = None) -> dict[str, Any]:
        """Run training to the end; returns rank-local results (rank 0's carry the checkpoints)."""
        out = self.trainer.train(resume_from_checkpoint=resume_from_checkpoint)
        if str(getattr(self.trainer.args.save_strategy, "value", self.trainer.args.save_strategy)) != "no":
            self.trainer.save_model(self.trainer.args.output_dir)  # writes on rank 0 only
        history = [dict(h) for h in self.trainer.state.log_history]
        return {
            "rank": self.rank,
            "global_step": int(self.trainer.state.global_step),
            "training_loss": float(getattr(out, "training_loss", float("nan"))),
            "log_history": history,
            "output_dir": self.trainer.args.output_dir,
            "plot_paths": list(getattr(self.trainer, "plot_paths", []) or []),
            "sync_history": list(getattr(self.trainer.sampler, "sync_history", [])),
            "param_checksum": _checksum(self.trainer.model),
            "entropy_control": self.trainer.entropy_bonus.state_dict() if self.trainer.entropy_bonus is not None else None,
        }

    def progress(self) -> dict[str, int]:
        return dict(self._progress)

    def ping(self) -> int:
        return self.rank


def _progress_probe(target: dict[str, int]) -> Any:
    """A TrainerCallback that mirrors step counts into a dict the driver polls."""
    from transformers import TrainerCallback

    class ProgressProbe(TrainerCallback):
        def _update(self, state: Any) -> None:
            target["global_step"] = int(state.global_step)
            target["max_steps"] = int(state.max_steps or 0)

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._update(state)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._update(state)

    return ProgressProbe()


def _checksum(model: Any) -> float:
    """Sum of all parameters in float64: equal on every rank iff the ranks stayed in sync."""
    import torch

    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in model.parameters()))
