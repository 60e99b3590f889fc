"""Ray placement for a hand-written loop (:mod:`rlcore.loop`): ``initialize(mode="ray", groups=[...])``
reserves named device groups, and a :class:`~rlcore.loop.Policy` or a sampler created with
``remote_group=`` lives on one of them — the loop's calls stay the same as locally (twinkle's style).

    from rlcore.distributed import DeviceGroup, initialize, make_sampler

    initialize(mode="ray", groups=[DeviceGroup("model", num_cpus=1), DeviceGroup("sampler", num_workers=2)])
    policy = Policy(model_path, loss="grpo", remote_group="model")     # an actor; same methods
    sampler = make_sampler("hf", model_path, remote_group="sampler")   # a pool of sampler actors
    sync_weights(policy, sampler)                                      # the policy's actor sends them

Why reuse :mod:`rlcore.distributed`: its placement groups reserve a group's resources atomically
and its ``RemoteSampler`` already routes trajectories, survives dead workers and syncs weights
through the object store or a broadcast group; a loop gets all of that unchanged.
``mode="local"`` (the default) places everything in this process and ``remote_group`` is ignored.
The loop layer knows only the placer protocol (:func:`rlcore.loop.placer.set_placer`); this
module, one layer up, is the Ray implementation of it.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import attrs

from ..errors import ConfigError
from .failures import first_line
from ..loop.placer import set_placer


@attrs.define
class DeviceGroup:
    """A named group of workers: how many, on which device, and what each reserves."""

    name: str
    num_workers: int = 1
    device: str = "cpu"
    num_cpus: float = 1.0
    num_gpus: float | None = None
    torch_threads: int = 1

    def worker_config(self) -> Any:
        from .layout import WorkerGroupConfig

        cfg = WorkerGroupConfig(num_workers=self.num_workers, device=self.device, num_cpus=self.num_cpus,  # type: ignore[arg-type]
                                num_gpus=self.num_gpus, torch_threads=self.torch_threads)
        cfg.validate(self.name)
        return cfg


@attrs.define
class _State:
    mode: str = "local"
    groups: dict[str, DeviceGroup] = attrs.field(factory=dict)
    placed: list[Any] = attrs.field(factory=list)
    timeout_s: float = 600.0


_STATE = _State()


def initialize(mode: str = "local", groups: Sequence[DeviceGroup] = (), *, address: str | None = None,
               num_cpus: float | None = None, timeout_s: float = 600.0) -> None:
    """Choose where the loop's parts run. ``mode="ray"`` joins ``address`` (or starts a local Ray
    big enough for ``groups``); a part created with ``remote_group=NAME`` is placed on that group."""
    global _STATE
    if mode not in ("local", "ray"):
        raise ConfigError(f"initialize(mode={mode!r}): mode is 'local' or 'ray'")
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        raise ConfigError(f"initialize: group names repeat ({', '.join(names)}); give each group its own name")
    for g in groups:
        g.worker_config()
    shutdown()
    if mode == "ray":
        import os

        from .runtime import ensure_ray

        need = sum(g.num_cpus * g.num_workers for g in groups)
        gpus = sum((g.num_gpus if g.num_gpus is not None else (1.0 if g.device == "gpu" else 0.0)) * g.num_workers
                   for g in groups)
        ensure_ray(address, num_cpus=num_cpus or max(need, float(os.cpu_count() or 1)), num_gpus=gpus or None)
    _STATE = _State(mode=mode, groups={g.name: g for g in groups}, timeout_s=float(timeout_s))
    set_placer(_RayPlacer() if mode == "ray" else None)


def shutdown() -> None:
    """Stop every actor this process placed and release their reservations (Ray itself keeps running)."""
    for placed in reversed(_STATE.placed):
        placed.remove()
    _STATE.placed.clear()


def group_for(name: str | None) -> DeviceGroup | None:
    """The group a part asked for, when the loop runs on Ray (``None``: build it locally)."""
    if name is None or _STATE.mode != "ray":
        return None
    if name not in _STATE.groups:
        raise ConfigError(f"remote_group={name!r} is not one of the groups given to initialize "
                          f"({', '.join(_STATE.groups) or 'none'})")
    return _STATE.groups[name]


def make_sampler(name: str, model: Any, tokenizer: Any = None, *, remote_group: str | None = None,
                 seed: int | None = None, weight_sync: str = "auto", bucket_bytes: int | None = None,
                 **options: Any) -> Any:
    """The registered sampler ``name`` for ``model``: here, or — with ``remote_group`` under
    ``initialize(mode="ray")`` — one per worker of that group behind one pool (same methods).

    ``weight_sync`` (a pool): how :func:`~rlcore.loop.sync_weights` reaches its workers —
    ``object_store`` (put once, every worker reads the same object: shared memory on one node),
    ``broadcast`` (a torch.distributed broadcast from the process holding the weights, in buckets
    of ``bucket_bytes``: NCCL between GPUs, gloo otherwise), ``nccl`` (the broadcast, GPUs only) or
    ``auto`` (the broadcast when the weights and the samplers are on GPUs, else the object store)."""
    if weight_sync not in ("auto", "object_store", "broadcast", "nccl"):
        raise ConfigError(f"make_sampler(weight_sync={weight_sync!r}): use auto, object_store, broadcast or nccl")
    group = group_for(remote_group)
    if group is None:
        from ..plugins import get as get_component

        if seed is not None:
            options["seed"] = seed
        return get_component("sampler", name)(model, tokenizer, **options)
    if not isinstance(model, str):
        raise ConfigError("a sampler on a Ray group loads its own copy: pass the model's path, not a module")
    from .cluster import start_samplers
    from .layout import DistributedConfig

    cfg = DistributedConfig(sampler=group.worker_config(), sampler_name=name, sampler_options=dict(options),
                            worker_timeout_s=_STATE.timeout_s)
    if weight_sync == "nccl" and group.device != "gpu":
        raise ConfigError(f"make_sampler(weight_sync='nccl'): group {group.name!r} is on {group.device}; "
                          "NCCL needs GPU workers (use broadcast or object_store)")
    placed, pool = start_samplers(cfg, model, tokenizer=tokenizer, seed=seed)
    _STATE.placed.append(placed)
    pool.weight_sync = "broadcast" if weight_sync == "nccl" else weight_sync
    pool.device = group.device
    pool.bucket_bytes = bucket_bytes
    return pool


def place_policy(group: DeviceGroup, args: tuple[Any, ...], kwargs: dict[str, Any]) -> "RemotePolicy":
    """Start ``group.num_workers`` :class:`PolicyWorker` actors on ``group``, each building
    ``Policy(*args, **kwargs)``; several join one process group (gloo on the CPU, NCCL on GPUs) and
    train data-parallel."""
    from .collective import free_port  # noqa: F401 - the worker asks for its own port
    from .placement_groups import place_actors
    from .runtime import require_ray

    if args and not isinstance(args[0], str):
        raise ConfigError("a Policy on a Ray group loads its own model: pass the model's path, not a module")
    kwargs = dict(kwargs)
    if group.device == "gpu" and kwargs.get("device") is None:
        kwargs["device"] = "cuda"  # Ray shows each GPU worker its one device
    world_size = group.num_workers
    placed = place_actors(group.name, PolicyWorker, group.worker_config(),
                          lambda rank: ((args, kwargs, group.torch_threads, rank, world_size, group.device), {}))
    _STATE.placed.append(placed)
    ray = require_ray()
    try:
        if world_size > 1:
            addr, port = ray.get(placed.actors[0].address.remote(), timeout=_STATE.timeout_s)
            ray.get([a.join.remote(addr, port, _STATE.timeout_s) for a in placed.actors], timeout=_STATE.timeout_s)
        ray.get([a.build.remote() for a in placed.actors], timeout=_STATE.timeout_s)
    except Exception as exc:  # noqa: BLE001 - the policy failed to build: say why, in one line
        placed.remove()
        _STATE.placed.remove(placed)
        cause = getattr(exc, "cause", None) or exc
        if isinstance(cause, Exception) and type(cause).__module__.startswith("rlcore"):
            raise cause from None
        raise ConfigError(f"the policy on group {group.name!r} failed to start: {first_line(cause)}") from None
    return RemotePolicy(placed.actors, args[0] if args else kwargs.get("model"), kwargs.get("tokenizer"),
                        group=group.name, placed=placed)


class _RayPlacer:
    """What :class:`~rlcore.loop.Policy` asks when built with ``remote_group=`` under ``mode="ray"``."""

    def place_policy(self, remote_group: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> "RemotePolicy | None":
        group = group_for(remote_group)
        return None if group is None else place_policy(group, args, kwargs)


class PolicyWorker:
    """One rank of a policy group: a Ray actor holding a :class:`Policy`. Ranks of a group join one
    torch process group first (:meth:`join`), so the Policy they build trains data-parallel
    (:mod:`rlcore.training.data_parallel`); :class:`RemotePolicy` forwards the loop's calls."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], torch_threads: int = 1, rank: int = 0,
                 world_size: int = 1, device: str = "cpu") -> None:
        import torch

        torch.set_num_threads(max(1, int(torch_threads)))
        self.args, self.kwargs = args, kwargs
        self.rank, self.world_size, self.device = int(rank), int(world_size), device
        self.policy: Any = None

    def address(self) -> tuple[str, int]:
        from .collective import free_port, node_ip

        return node_ip(), free_port()

    def join(self, master_addr: str, master_port: int, timeout_s: float = 600.0) -> str:
        """Join the group's process group (every rank at once: it blocks until all have)."""
        import datetime

        import torch.distributed as dist

        backend = "nccl" if self.device == "gpu" else "gloo"
        if backend == "nccl":
            import torch

            torch.cuda.set_device(0)  # Ray shows each GPU worker its one device
        if not dist.is_initialized():
            dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=self.rank,
                                    world_size=self.world_size, timeout=datetime.timedelta(seconds=timeout_s))
        return backend

    def build(self) -> int:
        from ..loop.policy import Policy

        self.policy = Policy(*self.args, **self.kwargs)
        return self.rank

    def ping(self) -> int:
        return self.policy.step if self.policy is not None else -1

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = getattr(self.policy, method)(*args, **kwargs)
        return out.cpu() if hasattr(out, "cpu") else out

    def forward_backward(self, inputs: Any, advantages: Any, old_logps: Any, ref_logps: Any,
                         kwargs: dict[str, Any]) -> dict[str, float]:
        """This rank's share: packed here, the given logprobs cut to its padded length."""
        batch = self.policy.batch(inputs, advantages)
        width = int(batch.input_ids.shape[1])
        return self.policy.forward_backward(batch, old_logps=_cut(old_logps, width),
                                            ref_logps=_cut(ref_logps, width), **kwargs)

    def logprobs(self, method: str, inputs: Any, kwargs: dict[str, Any]) -> Any:
        return getattr(self.policy, method)(inputs, **kwargs).cpu()

    def step(self) -> int:
        return self.policy.step

    def checksum(self) -> float:
        """Sum of every parameter in float64 (equal on every rank of a group that stayed in sync)."""
        import torch

        with torch.no_grad():
            return float(sum(p.detach().double().sum() for p in self.policy.model.parameters()))

    def state(self) -> dict[str, Any]:
        """CPU copies of the module's parameters (tests compare ranks and processes with them)."""
        return {n: p.detach().cpu().clone() for n, p in self.policy.model.named_parameters()}

    def sync_to(self, sampler: Any, version: int | None) -> dict[str, float]:
        """Send this rank's weights to a sampler pool. The pool's copy here is kept, so a broadcast
        group formed with its workers serves every later sync (the driver's deaths carried over)."""
        from ..loop.sync import sync_weights

        pools = self.__dict__.setdefault("_pools", {})
        key = tuple(str(getattr(w, "_actor_id", id(w))) for w in getattr(sampler, "workers", []))
        mine = pools.get(key)
        if mine is None:
            pools[key] = mine = sampler
        else:
            mine.router.alive &= set(sampler.router.alive)
            mine.weight_sync, mine.bucket_bytes = sampler.weight_sync, sampler.bucket_bytes
        return sync_weights(self.policy, mine, version=version)


def _cut(t: Any, width: int) -> Any:
    return None if t is None else t[:, :width]


class RemotePolicy:
    """A :class:`Policy` living in Ray actors, called exactly like a local one.

    One worker: every call goes to it. A group of ``N``: :meth:`forward_backward` and
    :meth:`logprobs` split the batch over the ranks (contiguous shares, whole trajectories) and the
    ranks compute one process's loss, normaliser and metrics over the whole of it;
    :meth:`clip_grad_and_step` averages the gradients and steps every rank; :meth:`save`,
    :meth:`weights` and :meth:`sync_to` use rank 0; :meth:`load` has rank 0 read and the others
    receive. A rank that dies fails the call with one line (:class:`WorkerFailedError`) and stops
    the group: build the Policy again and ``load`` the last checkpoint.
    """

    is_remote = True

    def __init__(self, actors: Any, model: Any, tokenizer: Any = None, *, group: str = "model",
                 placed: Any = None) -> None:
        from ..training.components import load_tokenizer

        self.actors = list(actors) if isinstance(actors, (list, tuple)) else [actors]
        self.group = group
        self._placed = placed
        self.failed: str | None = None
        self.tokenizer = load_tokenizer(model, tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (self.tokenizer.eos_token_id or 0))

    @property
    def actor(self) -> Any:
        """Rank 0's actor."""
        return self.actors[0]

    @property
    def num_workers(self) -> int:
        return len(self.actors)

    # --- calling the ranks -------------------------------------------------------------------------
    def _gather(self, refs: list[Any], what: str) -> list[Any]:
        """Every rank's result, in rank order. A rank that dies (or raises while the others wait
        for it in a collective) stops the group: one line, never a hang."""
        from .failures import WorkerFailedError
        from .runtime import require_ray

        if self.failed is not None:
            raise WorkerFailedError(self.failed)
        ray = require_ray()
        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        deadline = time.monotonic() + _STATE.timeout_s
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - one line below
                    raise self._failure(rank, what, exc, pending) from None
            if pending and time.monotonic() > deadline:
                ranks = ", ".join(str(r) for r in sorted(pending.values()))
                self._stop(f"policy worker(s) {ranks} of group {self.group!r} did not finish {what} within "
                           f"{_STATE.timeout_s:.0f}s; the policy group is stopped — build the Policy again and "
                           "load the last checkpoint (policy.load(path))")
                raise WorkerFailedError(self.failed)
        return [results[r] for r in range(len(refs))]

    def _failure(self, rank: int, what: str, exc: BaseException, pending: dict[Any, int]) -> BaseException:
        from ray.exceptions import RayActorError, RayTaskError

        from .failures import WorkerFailedError
        from .runtime import require_ray

        if isinstance(exc, RayActorError):
            self._stop(f"policy worker {rank} of group {self.group!r} died during {what} ({first_line(exc)}); "
                       "the policy group is stopped — build the Policy again and load the last checkpoint "
                       "(policy.load(path))")
            return WorkerFailedError(self.failed or "")
        cause = getattr(exc, "cause", None) if isinstance(exc, RayTaskError) else exc
        if pending:  # the others may wait for this rank in a collective: give them a moment, else stop
            ray = require_ray()
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=10.0)
            if len(ready) < len(pending):
                self._stop(f"policy worker {rank} of group {self.group!r} failed during {what} "
                           f"({first_line(cause or exc)}) while the other ranks waited for it; the policy group is "
                           "stopped — build the Policy again and load the last checkpoint (policy.load(path))")
        if isinstance(cause, Exception) and type(cause).__module__.startswith("rlcore"):
            return cause  # a user error raised inside the worker: its own one-line message
        if self.failed is not None:
            return WorkerFailedError(self.failed)
        return WorkerFailedError(f"policy worker {rank} of group {self.group!r} failed to {what}: {first_line(cause or exc)}")

    def _stop(self, why: str) -> None:
        self.failed = why
        self.close()

    def close(self) -> None:
        """Stop this policy's actors and release their reservation (:func:`shutdown` stops every
        part placed since :func:`initialize`)."""
        if self._placed is not None:
            self._placed.remove()
            if self._placed in _STATE.placed:
                _STATE.placed.remove(self._placed)
            self._placed = None
        if self.failed is None:
            self.failed = f"the policy on group {self.group!r} was closed"

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` on every rank (they may meet in collectives); rank 0's answer."""
        return self._gather([a.call.remote(method, args, kwargs) for a in self.actors], method)[0]

    def _call_rank0(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._gather([self.actor.call.remote(method, args, kwargs)], method)[0]

    @property
    def step(self) -> int:
        return int(self._gather([self.actor.step.remote()], "step")[0])

    # --- the loop's calls --------------------------------------------------------------------------
    def forward_backward(self, inputs: Any, advantages: Any = None, old_logps: Any = None, ref_logps: Any = None, *,
                         num_items: float | None = None, loss_scale: float = 1.0) -> dict[str, float]:
        shares = split_for_ranks(inputs, advantages, self.num_workers, old_logps=old_logps, ref_logps=ref_logps)
        kwargs = {"num_items": num_items, "loss_scale": loss_scale}
        refs = [a.forward_backward.remote(s.inputs, s.advantages, s.old_logps, s.ref_logps, kwargs)
                for a, s in zip(self.actors, shares)]
        return self._gather(refs, "forward_backward")[0]

    def clip_grad_and_step(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        return self._call("clip_grad_and_step", *args, **kwargs)

    def logprobs(self, inputs: Any, **kwargs: Any) -> Any:
        return self._logprobs("logprobs", inputs, kwargs)

    def ref_logprobs(self, inputs: Any, **kwargs: Any) -> Any:
        return self._logprobs("ref_logprobs", inputs, kwargs)

    def _logprobs(self, method: str, inputs: Any, kwargs: dict[str, Any]) -> Any:
        """Each rank scores its share; the rows come back in order, right-padded to one width."""
        import torch

        shares = split_for_ranks(inputs, None, self.num_workers)
        parts = self._gather([a.logprobs.remote(method, s.inputs, kwargs) for a, s in zip(self.actors, shares)], method)
        width = max((int(p.shape[1]) for p in parts), default=0)
        return torch.cat([torch.nn.functional.pad(p, (0, width - int(p.shape[1]))) for p in parts], 0)

    def weights(self, sampler: Any = None, *, lora: bool | None = None, to_cpu: bool = True) -> Any:
        from ..sampling.weight_export import sampler_accepts_lora

        if lora is None:  # asked here: a local sampler does not travel to the actor
            lora = sampler is not None and sampler_accepts_lora(sampler)
        return self._call_rank0("weights", None, lora=lora, to_cpu=True)

    def save(self, path: Any) -> str:
        """Rank 0 writes (every rank holds its weights)."""
        return self._call_rank0("save", str(path))

    def load(self, path: Any) -> None:
        """Rank 0 reads ``path``; the other ranks receive the weights and optimizer state from it."""
        return self._call("load", str(path))

    def checksums(self) -> list[float]:
        """Every rank's parameter checksum (equal while the group stays in sync)."""
        return [float(x) for x in self._gather([a.checksum.remote() for a in self.actors], "checksum")]

    def state_dict(self) -> dict[str, Any]:
        """Rank 0's parameters, as CPU tensors."""
        return self._gather([self.actor.state.remote()], "state")[0]

    def sync_to(self, sampler: Any, version: int | None = None) -> dict[str, float]:
        """Ray samplers get the weights straight from rank 0's actor (one export; every rank holds
        the same weights); a sampler in this process gets CPU copies fetched from it."""
        if hasattr(sampler, "sync_mode"):  # a RemoteSampler: picklable, the actor sends to the pool
            version = self.step if version is None else int(version)
            metrics = self._gather([self.actor.sync_to.remote(sampler, version)], "sync_weights")[0]
            sampler.policy_version = version  # the actor updated its copy of the pool; this is ours
            sampler.last_sync = dict(metrics)
            sampler.sync_history.append(dict(metrics))
            return metrics
        weights, lora = self.weights(sampler)
        sampler.update_weights(weights, lora=lora)
        sampler.policy_version = self.step if version is None else int(version)
        reset = getattr(sampler, "reset_prefix_cache", None)
        if reset is not None:
            reset()
        return {}


@attrs.define
class Share:
    """One rank's part of a batch: trajectories (or a Batch), their advantages and logprob rows."""

    inputs: Any
    advantages: Any = None
    old_logps: Any = None
    ref_logps: Any = None


def split_for_ranks(inputs: Any, advantages: Any, ranks: int, *, old_logps: Any = None,
                    ref_logps: Any = None) -> list[Share]:
    """``inputs`` cut into ``ranks`` contiguous shares of whole trajectories (sizes differ by one at
    most; a rank may get none); ``[B, T]`` logprob tensors cut along the rows each share packs to
    (a trajectory with per-turn samples packs to one row per sample)."""
    from ..types import Batch

    if ranks == 1:
        return [Share(inputs, advantages, old_logps, ref_logps)]
    if isinstance(inputs, Batch):
        if advantages is not None:
            raise ConfigError("a Batch carries its advantages already; pass advantages= with trajectories only")
        bounds = _bounds(inputs.size, ranks)
        return [Share(inputs.select(slice(a, b)), None, _rows(old_logps, a, b), _rows(ref_logps, a, b))
                for a, b in bounds]
    from ..loop.loss import advantage_list

    trajs = list(inputs)
    adv = advantage_list(advantages) if advantages is not None else None
    if adv is not None and len(adv) != len(trajs):
        raise ConfigError(f"{len(adv)} advantages for {len(trajs)} trajectories; give one per trajectory")
    expand = any(t.has_turn_samples for t in trajs)
    rows = [len(t.turn_samples()) if expand and t.has_turn_samples else 1 for t in trajs]
    out = []
    for a, b in _bounds(len(trajs), ranks):
        r0, r1 = sum(rows[:a]), sum(rows[:b])
        out.append(Share(trajs[a:b], adv[a:b] if adv is not None else None, _rows(old_logps, r0, r1),
                         _rows(ref_logps, r0, r1)))
    return out


def _bounds(n: int, ranks: int) -> list[tuple[int, int]]:
    base, extra = divmod(n, ranks)
    out, start = [], 0
    for r in range(ranks):
        stop = start + base + (1 if r < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def _rows(t: Any, a: int, b: int) -> Any:
    return None if t is None else t[a:b]

