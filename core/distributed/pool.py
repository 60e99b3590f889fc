"""``RemoteSampler``: the :class:`~rlcore.sampling.base.Sampler` protocol over a group of sampler actors.

The rollout driver and every scheduler use it exactly like a local sampler; behind it, each
trajectory is routed to one worker (sticky, least-loaded; see :mod:`rlcore.distributed.routing`)
and weight updates go to all workers at once through the Ray object store (the weights are put
once, every worker reads the same object). Time per sync is recorded in :attr:`last_sync`.

Failure behaviour (documented in docs/distributed.md): when a sampler worker dies, its in-flight
trajectories are retried on the remaining workers, once each (a second dead worker under the same
trajectory fails it with the reason), and it is dropped from the pool — generation *recovers* at
lower throughput. When no worker is left, or one stops answering for ``timeout_s``, generation fails
with :class:`~rlcore.distributed.failures.WorkerFailedError` — it never hangs.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..asyncutil import run_sync
from ..sampling.base import Sampler, WeightsLike
from ..types import Completion, SamplingParams
from .failures import WorkerFailedError
from .routing import Router, current_key
from .runtime import require_ray


class RemoteSampler(Sampler):
    """A pool of :class:`~rlcore.distributed.sampler_worker.SamplerWorker` actors behind one Sampler."""

    name = "ray"

    def __init__(self, workers: list[Any], tokenizer: Any = None, *, timeout_s: float = 600.0) -> None:
        if not workers:
            raise ValueError("RemoteSampler needs at least one sampler worker")
        self.workers = list(workers)
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self.router = Router(len(workers))
        self.policy_version = 0
        #: metrics of the most recent weight sync (``sync/*``)
        self.last_sync: dict[str, float] = {}
        self.sync_history: list[dict[str, float]] = []
        self.dead: dict[int, str] = {}
        #: requests moved to another worker after theirs died
        self.retries = 0
        self._accepts_lora: bool | None = None
        self._broadcast: Any = None  # a BroadcastGroup, in the process that owns the weights
        self._broadcast_members: list[int] = []
        #: how a sync reaches the workers: ``object_store``, ``broadcast`` (NCCL between GPUs, gloo
        #: otherwise), or ``auto`` (the broadcast when sender and samplers are all on GPUs)
        self.weight_sync = "object_store"
        self.device = "cpu"
        self.bucket_bytes: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (trainer workers receive the pool): routing state starts fresh on the other side."""
        state = dict(self.__dict__)
        state["router"] = None
        state["_broadcast"] = None  # a process group cannot travel; the receiver sets up its own
        state["_broadcast_members"] = []
        state["_alive"] = sorted(self.router.alive)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        alive = state.pop("_alive")
        self.__dict__.update(state)
        self.router = Router(len(self.workers))
        self.router.alive = set(alive)

    # --- generation --------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        """Route to the trajectory's worker; when that worker dies, the trajectory moves to another
        live worker once (its earlier turns stay as sampled); a second dead worker, or none left,
        ends it with :class:`WorkerFailedError` (the rollout fails that trajectory with the reason)."""
        key = current_key()
        attempts: list[int] = []  # this call's dead workers (a request with no trajectory key)
        while True:
            try:
                idx = self.router.pick(key)
            except LookupError:
                raise WorkerFailedError(self._all_dead_message()) from None
            self.router.inflight[idx] += 1
            try:
                ref = self.workers[idx].generate.remote(list(prompt_ids), params)
                return await asyncio.wait_for(_await_ref(ref), timeout=self.timeout_s)
            except asyncio.TimeoutError:
                raise WorkerFailedError(
                    f"sampler worker {idx} did not answer within {self.timeout_s:.0f}s; "
                    "it is overloaded or hung — raise worker_timeout_s or check its logs"
                ) from None
            except Exception as exc:  # noqa: BLE001 - only actor death is handled; the rest re-raised
                if not _is_actor_death(exc):
                    raise _unwrap_task_error(exc) from None
                self.router.mark_dead(idx)
                self.dead[idx] = _first_line(exc)
                attempts.append(idx)
                lost = self.router.lost(key, idx) if key is not None else attempts
                self.retries += 1
                if len(lost) > 1:
                    raise WorkerFailedError(
                        f"sampler workers {', '.join(str(i) for i in lost)} died under this trajectory "
                        f"({self.dead[lost[-1]]}); it was retried once and is not retried again"
                    ) from None
            finally:
                self.router.inflight[idx] -= 1

    def _all_dead_message(self) -> str:
        why = "; ".join(f"worker {i}: {r}" for i, r in sorted(self.dead.items())) or "none started"
        return (
            f"all {len(self.workers)} sampler workers are dead ({why}); "
            "restart the run (resume from the last checkpoint) or add sampler workers"
        )

    @property
    def alive_workers(self) -> list[int]:
        return sorted(self.router.alive)

    # --- weights -----------------------------------------------------------------------------------
    def accepts_lora(self) -> bool:
        """Whether every live worker can load adapter-only updates (asked once)."""
        if self._accepts_lora is None:
            ray = require_ray()
            infos = ray.get([self.workers[i].info.remote() for i in self.alive_workers], timeout=self.timeout_s)
            self._accepts_lora = all(i["accepts_lora"] for i in infos)
        return self._accepts_lora

    def setup_broadcast(self, backend: str = "gloo", bucket_bytes: int | None = None) -> None:
        """Form a broadcast group of this process (rank 0, the weight owner) and every live sampler
        worker; later syncs travel over it (NCCL between GPUs) instead of the object store, in
        buckets of at most ``bucket_bytes`` (default :data:`~rlcore.distributed.collective.BUCKET_BYTES`)."""
        ray = require_ray()
        from .collective import BUCKET_BYTES, BroadcastGroup, free_port, node_ip

        size = int(bucket_bytes or BUCKET_BYTES)
        init = f"tcp://{node_ip()}:{free_port()}"
        members = self.alive_workers
        world = len(members) + 1
        refs = [self.workers[i].join_sync_group.remote(init, k + 1, world, backend, size) for k, i in enumerate(members)]
        self._broadcast = BroadcastGroup(init, 0, world, backend, timeout_s=self.timeout_s, bucket_bytes=size)
        ray.get(refs, timeout=self.timeout_s)
        self._broadcast_members = members

    def prepare_sync(self, sender_device: str = "cpu") -> str:
        """Before a sync from a process whose weights live on ``sender_device`` (``cpu``/``cuda``):
        form the broadcast group once when :attr:`weight_sync` asks for it; the mode used."""
        wanted = self.weight_sync
        gpus = self.device == "gpu" and str(sender_device).startswith("cuda")
        if wanted == "auto":
            wanted = "object_store"
            if gpus:
                import torch.distributed as dist

                wanted = "broadcast" if dist.is_nccl_available() else "object_store"
        if wanted == "broadcast" and self._broadcast is None:
            self.setup_broadcast("nccl" if gpus else "gloo", bucket_bytes=self.bucket_bytes)
        return self.sync_mode

    @property
    def sync_mode(self) -> str:
        return "broadcast" if self._broadcast is not None else "object_store"

    def update_weights(self, weights: WeightsLike, *, lora: bool = False, version: int | None = None) -> dict[str, float]:
        """Send ``weights`` to every live worker through the object store; blocks until all loaded."""
        return run_sync(self.update_weights_async(weights, lora=lora, version=version))

    async def update_weights_async(
        self, weights: WeightsLike, *, lora: bool = False, version: int | None = None
    ) -> dict[str, float]:
        """Awaitable form (async mode syncs while rollouts run on the same loop). Returns ``sync/*``."""
        ray = require_ray()
        from ..sampling.weight_export import nbytes

        t0 = time.perf_counter()
        items = list(weights.items() if hasattr(weights, "items") else weights)
        new_version = self.policy_version + 1 if version is None else int(version)
        if self._broadcast is not None:
            from .collective import specs_of

            specs = specs_of(items)
            refs = [self.workers[i].receive_broadcast.remote(specs, lora, new_version) for i in self._broadcast_members]
            await asyncio.to_thread(self._broadcast.send, items)
            t_put = time.perf_counter() - t0
            try:
                loads = await asyncio.wait_for(asyncio.gather(*(_await_ref(r) for r in refs)), timeout=self.timeout_s)
            except Exception as exc:  # noqa: BLE001 - a broadcast needs every member
                raise WorkerFailedError(
                    f"weight broadcast to the sampler workers failed ({_first_line(exc)}); "
                    "use weight_sync object_store to tolerate sampler loss"
                ) from None
            size = float(sum(t.numel() * t.element_size() for _, t in items))
        else:
            cpu = {n: t.detach().to("cpu") for n, t in items}
            ref = ray.put(cpu)
            t_put = time.perf_counter() - t0
            loads = await self._call_all("update_weights", ref, lora, new_version)
            size = float(nbytes(cpu))
        self.policy_version = new_version
        total = time.perf_counter() - t0
        metrics = {
            "sync/seconds": total,
            "sync/put_seconds": t_put,
            "sync/load_seconds_max": max((r["load_s"] for r in loads), default=0.0),
            "sync/bytes": size,
            "sync/broadcast": 1.0 if self._broadcast is not None else 0.0,
            "sync/buckets": float(self._broadcast.last_buckets) if self._broadcast is not None else 1.0,
            "sync/workers": float(len(loads)),
            "sync/policy_version": float(new_version),
        }
        self.last_sync = metrics
        self.sync_history.append(metrics)
        return metrics

    async def _call_all(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on every live worker; dead ones are dropped (and must not all be dead)."""
        idxs = self.alive_workers
        if not idxs:
            raise WorkerFailedError(self._all_dead_message())
        refs = [getattr(self.workers[i], method).remote(*args) for i in idxs]
        results = await asyncio.wait_for(
            asyncio.gather(*(_await_ref(r) for r in refs), return_exceptions=True), timeout=self.timeout_s
        )
        out = []
        for i, r in zip(idxs, results):
            if isinstance(r, BaseException):
                if not _is_actor_death(r):
                    raise _unwrap_task_error(r)
                self.router.mark_dead(i)
                self.dead[i] = _first_line(r)
            else:
                out.append(r)
        if not out:
            raise WorkerFailedError(self._all_dead_message())
        return out

    def infos(self) -> list[dict[str, Any]]:
        ray = require_ray()
        return ray.get([self.workers[i].info.remote() for i in self.alive_workers], timeout=self.timeout_s)

    def sleep(self, level: int = 1) -> None:
        run_sync(self._call_all("sleep", level))

    def wake_up(self) -> None:
        run_sync(self._call_all("wake_up"))

    async def close(self) -> None:
        try:
            await self._call_all("close")
        except WorkerFailedError:
            pass

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False) if self.tokenizer is not None else ""


async def _await_ref(ref: Any) -> Any:
    return await ref


def _is_actor_death(exc: BaseException) -> bool:
    try:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, (RayActorError, ActorDiedError, ActorUnavailableError))


def _unwrap_task_error(exc: BaseException) -> BaseException:
    """A user error raised inside a worker (e.g. SamplerError) comes back as itself, not wrapped."""
    try:
        from ray.exceptions import RayTaskError
    except ImportError:  # pragma: no cover
        return exc
    if isinstance(exc, RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            return cause
    return exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]
