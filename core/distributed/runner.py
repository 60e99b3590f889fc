"""The driver of ``rlcore train --distributed ray``: place both groups, train, tear down — and
never hang when a worker dies.

Why the driver polls instead of blocking on ``ray.get``: when one trainer rank dies, the others
sit in an all-reduce waiting for it. The driver sees the dead rank's result fail, kills the rest
and raises :class:`WorkerFailedError` naming the rank, within a poll interval.
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from .cluster import connect, start_samplers
from .layout import DistributedConfig
from .failures import WorkerFailedError, first_line
from .placement_groups import PlacedGroup, place_actors
from .runtime import require_ray


@attrs.define
class DistributedResult:
    """What rank 0 reports at the end, plus the sampler pool's sync history."""

    global_step: int
    training_loss: float
    log_history: list[dict[str, Any]]
    output_dir: str
    sync_history: list[dict[str, float]]
    plot_paths: list[str] = attrs.field(factory=list)
    #: every rank's result (``param_checksum`` equal across ranks shows they stayed in sync)
    ranks: list[dict[str, Any]] = attrs.field(factory=list)


def run_distributed(
    model: str,
    args: Any,
    rows: list[dict[str, Any]],
    config: DistributedConfig,
    *,
    reward_funcs: Any = None,
    scheduler: Any = None,
    prompt_column: str | None = None,
    system_prompt: str | None = None,
    resume_from_checkpoint: Any = None,
    progress: bool = True,
    on_started: Any = None,
    samplers: tuple[PlacedGroup, Any] | None = None,
) -> DistributedResult:
    """Train ``model`` (a path) with ``args`` (a GRPOConfig) on ``rows`` over Ray.

    ``scheduler`` may be a scheduler object (shipped to every trainer rank by pickle) instead of
    ``args.scheduler``'s name. ``on_started(trainers, sampler_group)`` is called once both groups are up
    (tests use it to inject faults). ``samplers`` reuses an already placed sampler group and its pool
    (it is then left running).
    """
    config.validate()
    ray = require_ray()
    started_here = not ray.is_initialized()
    connect(config)
    trainers: PlacedGroup | None = None
    owned: PlacedGroup | None = None
    try:
        if samplers is None:
            owned, pool = start_samplers(config, model, seed=int(getattr(args, "seed", 0) or 0))
            sampler_group = owned
        else:
            sampler_group, pool = samplers
        trainers = _start_trainers(config)
        from .trainer_worker import config_fields

        setup_kwargs = dict(
            reward_funcs=reward_funcs,
            prompt_column=prompt_column,
            system_prompt=system_prompt,
            sync_every=config.sync_every,
            async_generation=config.async_generation,
            max_staleness=config.max_staleness,
            weight_sync=config.resolved_weight_sync,
            broadcast_backend=config.broadcast_backend,
        )
        fields = config_fields(args)
        if scheduler is not None:
            setup_kwargs["scheduler"] = scheduler
        _wait_all(
            trainers,
            [a.setup.remote(model, fields, rows, pool, **setup_kwargs) for a in trainers.actors],
            "set up",
            config.worker_timeout_s,
        )
        if on_started is not None:
            on_started(trainers, sampler_group)
        refs = [a.train.remote(resume_from_checkpoint) for a in trainers.actors]
        results = _wait_all(trainers, refs, "train", None, progress=progress)
        rank0 = results[0]
        return DistributedResult(
            global_step=rank0["global_step"],
            training_loss=rank0["training_loss"],
            log_history=rank0["log_history"],
            output_dir=rank0["output_dir"],
            sync_history=rank0.get("sync_history", []),
            plot_paths=rank0.get("plot_paths", []),
            ranks=[{k: v for k, v in r.items() if k != "log_history"} for r in results],
        )
    finally:
        for grp in (trainers, owned):
            if grp is not None:
                grp.remove()
        if started_here:
            ray.shutdown()


def _start_trainers(config: DistributedConfig) -> PlacedGroup:
    """Place the trainer ranks and join them into one torch.distributed group."""
    from .trainer_worker import TrainerWorker

    ray = require_ray()
    grp = config.trainer
    placed = place_actors(
        "trainer",
        TrainerWorker,
        grp,
        lambda rank: ((rank, grp.num_workers, grp.device, grp.torch_threads), {}),
        strategy=config.placement_strategy,
    )
    addr, port = ray.get(placed.actors[0].address.remote(), timeout=config.worker_timeout_s)
    _wait_all(
        placed,
        [a.init_process_group.remote(addr, port, config.worker_timeout_s) for a in placed.actors],
        "join the process group",
        config.worker_timeout_s,
    )
    return placed


def _wait_all(
    group: PlacedGroup, refs: list[Any], what: str, timeout_s: float | None, *, progress: bool = False
) -> list[Any]:
    """Results of ``refs`` in rank order. The first failure kills the group and raises one line."""
    ray = require_ray()
    pending = {ref: rank for rank, ref in enumerate(refs)}
    results: dict[int, Any] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    bar = _Progress(group, enabled=progress)
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            bar.poll()
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - turned into one clear line below
                    group.remove()
                    raise _failure(group.name, rank, what, exc) from None
            if deadline is not None and time.monotonic() > deadline and pending:
                group.remove()
                ranks = ", ".join(str(r) for r in sorted(pending.values()))
                raise WorkerFailedError(
                    f"{group.name} worker(s) {ranks} did not {what} within {timeout_s:.0f}s; raise worker_timeout_s or check the Ray logs"
                )
    finally:
        bar.close()
    return [results[r] for r in range(len(refs))]


def _failure(group: str, rank: int, what: str, exc: BaseException) -> BaseException:
    from ray.exceptions import RayActorError, RayTaskError

    if isinstance(exc, RayActorError):
        return WorkerFailedError(
            f"{group} worker {rank} died during {what} ({first_line(exc)}); the run stopped — "
            "resume with --resume-from-checkpoint from the last checkpoint"
        )
    cause = getattr(exc, "cause", None) if isinstance(exc, RayTaskError) else exc
    if isinstance(cause, Exception) and type(cause).__module__.startswith("rlcore"):
        return cause  # a user error raised inside the worker: keep its own one-line message
    return WorkerFailedError(f"{group} worker {rank} failed to {what}: {first_line(cause or exc)}")



class _Progress:
    """A driver-side progress bar fed by polling trainer rank 0 (worker output is not streamed)."""

    def __init__(self, group: PlacedGroup, enabled: bool) -> None:
        self.group = group
        self.enabled = enabled
        self._bar: Any = None
        self._task: Any = None
        self._last = 0.0

    def poll(self) -> None:
        if not self.enabled or time.monotonic() - self._last < 1.0:
            return
        self._last = time.monotonic()
        ray = require_ray()
        try:
            p = ray.get(self.group.actors[0].progress.remote(), timeout=5)
        except Exception:  # noqa: BLE001 - progress is best effort
            return
        if self._bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("training (ray)"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self._bar.start()
            self._task = self._bar.add_task("train", total=p["max_steps"] or None)
        self._bar.update(self._task, completed=p["global_step"], total=p["max_steps"] or None)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
