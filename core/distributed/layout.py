"""How a distributed run is laid out: a ``trainer`` group and a ``sampler`` group of Ray workers.

Why a config object and not flags scattered through the code: the same layout has to be described
on one laptop (CPU, fractional cores), on one multi-GPU box and on a multi-node cluster, and the
only things that change between them are these numbers. ``docs/distributed.md`` shows each.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

import attrs

from ..errors import ConfigError

Device = Literal["cpu", "gpu"]
WeightSyncMode = Literal["auto", "object_store", "broadcast", "nccl"]


@attrs.define
class WorkerGroupConfig:
    """One group of identical workers: how many, on which device, and what each reserves.

    ``num_cpus`` may be fractional (0.5) so a 2-core laptop can host several actors; ``num_gpus``
    defaults to one GPU per worker when ``device == "gpu"`` and none on CPU.
    """

    num_workers: int = 1
    device: Device = "cpu"
    num_cpus: float = 1.0
    num_gpus: float | None = None
    #: torch intra-op threads per worker (keeps CPU workers from oversubscribing cores)
    torch_threads: int = 1

    @property
    def gpus_per_worker(self) -> float:
        if self.num_gpus is not None:
            return float(self.num_gpus)
        return 1.0 if self.device == "gpu" else 0.0

    def bundle(self) -> dict[str, float]:
        """The Ray placement-group bundle one worker of this group occupies."""
        b = {"CPU": float(self.num_cpus)}
        if self.gpus_per_worker > 0:
            b["GPU"] = self.gpus_per_worker
        return b

    def validate(self, group: str) -> None:
        if self.num_workers < 1:
            raise ConfigError(f"distributed {group} group needs at least 1 worker, got num_workers={self.num_workers}")
        if self.device not in ("cpu", "gpu"):
            raise ConfigError(f"distributed {group} device must be 'cpu' or 'gpu', got {self.device!r}")
        if self.num_cpus < 0 or (self.num_gpus is not None and self.num_gpus < 0):
            raise ConfigError(f"distributed {group} resources must be >= 0 (num_cpus={self.num_cpus}, num_gpus={self.num_gpus})")
        if self.device == "gpu" and self.gpus_per_worker == 0:
            raise ConfigError(f"distributed {group} device is 'gpu' but num_gpus=0; give each worker a GPU share")


@attrs.define
class DistributedConfig:
    """The whole layout of a ``--distributed ray`` run.

    Attributes:
        trainer: data-parallel trainer workers (torch.distributed: gloo on CPU, NCCL on GPU).
        sampler: generation workers, each hosting one sampler backend.
        address: a Ray cluster to join (``ray://…`` or ``host:port``); ``None`` starts a local one.
        num_cpus: logical CPUs of a local Ray instance (default: what the groups need, at least the
            machine's cores) — Ray's CPUs are bookkeeping, not pinning.
        placement_strategy: Ray placement-group strategy per group (``PACK`` keeps a group on as few
            nodes as possible; ``SPREAD`` puts workers on different nodes).
        weight_sync: ``object_store`` (any device: put once, every sampler reads it), ``broadcast``
            (a torch.distributed broadcast from trainer rank 0 to every sampler: NCCL on GPU, gloo on
            CPU), ``nccl`` (broadcast, GPU required), ``auto`` (NCCL broadcast when both groups are on
            GPU and NCCL is available, else the object store).
        sync_every: push weights to the samplers every k optimizer steps.
        async_generation: produce the next step's rollouts while this step trains.
        max_staleness: in async mode, drop trajectories sampled more than k policy versions ago.
        sampler_name: the registered sampler backend each sampler worker hosts.
        sampler_options: keyword options for that backend.
        worker_timeout_s: how long the driver waits on one worker call before declaring it hung.
    """

    trainer: WorkerGroupConfig = attrs.field(factory=WorkerGroupConfig)
    sampler: WorkerGroupConfig = attrs.field(factory=WorkerGroupConfig)
    address: str | None = None
    num_cpus: float | None = None
    placement_strategy: str = "PACK"
    weight_sync: WeightSyncMode = "auto"
    sync_every: int = 1
    async_generation: bool = False
    max_staleness: int = 1
    sampler_name: str = "hf"
    sampler_options: dict[str, Any] = attrs.field(factory=dict)
    worker_timeout_s: float = 600.0

    def validate(self) -> "DistributedConfig":
        self.trainer.validate("trainer")
        self.sampler.validate("sampler")
        if self.placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ConfigError(
                f"placement_strategy must be PACK, SPREAD, STRICT_PACK or STRICT_SPREAD, got {self.placement_strategy!r}"
            )
        if self.weight_sync not in ("auto", "object_store", "broadcast", "nccl"):
            raise ConfigError(f"weight_sync must be auto, object_store, broadcast or nccl, got {self.weight_sync!r}")
        if self.weight_sync == "nccl" and (self.trainer.device != "gpu" or self.sampler.device != "gpu"):
            raise ConfigError("weight_sync='nccl' needs both trainer and sampler groups on device 'gpu'; use object_store")
        if self.sync_every < 1:
            raise ConfigError(f"sync_every must be >= 1, got {self.sync_every}")
        if self.max_staleness < 0:
            raise ConfigError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.worker_timeout_s <= 0:
            raise ConfigError(f"worker_timeout_s must be > 0, got {self.worker_timeout_s}")
        return self

    @property
    def broadcast_backend(self) -> str:
        """The collective backend of a broadcast sync: NCCL between GPUs, gloo otherwise."""
        return "nccl" if self.trainer.device == "gpu" and self.sampler.device == "gpu" else "gloo"

    @property
    def resolved_weight_sync(self) -> str:
        """``object_store`` or ``broadcast`` after resolving ``auto`` and ``nccl``."""
        if self.weight_sync in ("broadcast", "nccl"):
            return "broadcast"
        if self.weight_sync == "object_store":
            return "object_store"
        if self.trainer.device == "gpu" and self.sampler.device == "gpu":
            try:
                import torch.distributed as dist

                if dist.is_nccl_available():
                    return "broadcast"
            except Exception:  # noqa: BLE001 - any import trouble means: no NCCL
                pass
        return "object_store"

    @property
    def total_cpus(self) -> float:
        return (self.trainer.num_workers * self.trainer.num_cpus) + (self.sampler.num_workers * self.sampler.num_cpus)

    @property
    def total_gpus(self) -> float:
        return (self.trainer.num_workers * self.trainer.gpus_per_worker) + (
            self.sampler.num_workers * self.sampler.gpus_per_worker
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DistributedConfig":
        """Build from a YAML/JSON mapping (``trainer:``/``sampler:`` sub-mappings); unknown keys are an error."""
        d = dict(d)
        groups = {}
        for g in ("trainer", "sampler"):
            sub = dict(d.pop(g, None) or {})
            known = {f.name for f in attrs.fields(WorkerGroupConfig)}
            extra = set(sub) - known
            if extra:
                raise ConfigError(f"unknown key(s) in distributed.{g}: {', '.join(sorted(extra))}; known: {', '.join(sorted(known))}")
            groups[g] = WorkerGroupConfig(**sub)
        known = {f.name for f in attrs.fields(cls)}
        extra = set(d) - known
        if extra:
            raise ConfigError(f"unknown key(s) in distributed config: {', '.join(sorted(extra))}; known: {', '.join(sorted(known))}")
        return cls(**groups, **d).validate()

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)
