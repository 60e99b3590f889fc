"""Reserve resources for a worker group with a Ray placement group and start one actor per bundle.

Why placement groups: they reserve a group's resources atomically (all N workers or none), so a
run never starts with half its trainers and deadlocks waiting for the rest, and ``PACK``/``SPREAD``
say whether a group shares a node (NCCL over NVLink) or spans nodes.
"""

from __future__ import annotations

from typing import Any

import attrs

from .layout import WorkerGroupConfig
from .failures import WorkerFailedError
from .runtime import require_ray, worker_env


@attrs.define
class PlacedGroup:
    """The actors of one group and the placement group that reserves their resources."""

    name: str
    actors: list[Any]
    placement_group: Any

    def remove(self) -> None:
        """Kill the actors and release the reservation."""
        ray = require_ray()
        from ray.util.placement_group import remove_placement_group

        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead is fine
                pass
        try:
            remove_placement_group(self.placement_group)
        except Exception:  # noqa: BLE001
            pass


def reserve(name: str, group: WorkerGroupConfig, *, strategy: str = "PACK", timeout_s: float = 60.0) -> Any:
    """Create and wait for a placement group of ``group.num_workers`` bundles.

    Raises WorkerFailedError with the missing resources when the cluster cannot satisfy it in time
    (rather than waiting forever, which is Ray's default).
    """
    ray = require_ray()
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [group.bundle() for _ in range(group.num_workers)]
    import uuid

    # unique per run: several runs (or tests) may share one cluster
    pg = placement_group(bundles, strategy=strategy, name=f"rlcore-{name}-{uuid.uuid4().hex[:8]}")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        have = ray.available_resources()
        raise WorkerFailedError(
            f"Ray cannot place the {name} group ({group.num_workers} x {group.bundle()}) within {timeout_s:.0f}s; "
            f"available: CPU={have.get('CPU', 0):g} GPU={have.get('GPU', 0):g} — lower num_workers/num_cpus/num_gpus or add nodes"
        )
    return pg


def place_actors(
    name: str,
    actor_cls: Any,
    group: WorkerGroupConfig,
    args_for_rank: Any,
    *,
    strategy: str = "PACK",
    timeout_s: float = 60.0,
) -> PlacedGroup:
    """Start ``group.num_workers`` actors of ``actor_cls`` (a plain class), one per bundle.

    ``args_for_rank(rank) -> (args, kwargs)`` gives each actor its constructor arguments.
    """
    ray = require_ray()
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = reserve(name, group, strategy=strategy, timeout_s=timeout_s)
    remote_cls = ray.remote(actor_cls)
    actors = []
    for rank in range(group.num_workers):
        args, kwargs = args_for_rank(rank)
        actors.append(
            remote_cls.options(
                num_cpus=group.num_cpus,
                num_gpus=group.gpus_per_worker,
                name=None,
                max_restarts=0,
                max_concurrency=1000 if _is_async(actor_cls) else 4,
                runtime_env={"env_vars": {**worker_env(), "OMP_NUM_THREADS": str(group.torch_threads)}},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=rank
                ),
            ).remote(*args, **kwargs)
        )
    return PlacedGroup(name=name, actors=actors, placement_group=pg)


def _is_async(cls: Any) -> bool:
    import inspect

    return any(inspect.iscoroutinefunction(getattr(cls, n, None)) for n in dir(cls) if not n.startswith("__"))
