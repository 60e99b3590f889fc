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
The loop layer knows only the placer protocol (:func:`rlcore.loop.placement.set_placer`); this
module, one layer up, is the Ray implementation of it.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs

from ..errors import ConfigError
from ..loop.placement import set_placer


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
        from .config import WorkerGroupConfig

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
                 seed: int | None = None, **options: Any) -> Any:
    """The registered sampler ``name`` for ``model``: here, or — with ``remote_group`` under
    ``initialize(mode="ray")`` — one per worker of that group behind one pool (same methods)."""
    group = group_for(remote_group)
    if group is None:
        from ..plugins import get as get_component

        if seed is not None:
            options["seed"] = seed
        return get_component("sampler", name)(model, tokenizer, **options)
    if not isinstance(model, str):
        raise ConfigError("a sampler on a Ray group loads its own copy: pass the model's path, not a module")
    from .cluster import start_samplers
    from .config import DistributedConfig

    cfg = DistributedConfig(sampler=group.worker_config(), sampler_name=name, sampler_options=dict(options),
                            worker_timeout_s=_STATE.timeout_s)
    placed, pool = start_samplers(cfg, model, tokenizer=tokenizer, seed=seed)
    _STATE.placed.append(placed)
    return pool


def place_policy(group: DeviceGroup, args: tuple[Any, ...], kwargs: dict[str, Any]) -> "RemotePolicy":
    """Start one :class:`PolicyWorker` on ``group`` building ``Policy(*args, **kwargs)``."""
    from .placement import place_actors
    from .runtime import require_ray

    if group.num_workers != 1:
        raise ConfigError(f"a Policy runs on one worker; group {group.name!r} has num_workers={group.num_workers} "
                          "(data-parallel training: GRPOTrainer with --distributed ray)")
    if args and not isinstance(args[0], str):
        raise ConfigError("a Policy on a Ray group loads its own model: pass the model's path, not a module")
    placed = place_actors(group.name, PolicyWorker, group.worker_config(),
                          lambda rank: ((args, kwargs, group.torch_threads), {}))
    _STATE.placed.append(placed)
    ray = require_ray()
    actor = placed.actors[0]
    try:
        ray.get(actor.ping.remote(), timeout=_STATE.timeout_s)
    except Exception as exc:  # noqa: BLE001 - the policy failed to build: say why, in one line
        cause = getattr(exc, "cause", None) or exc
        if isinstance(cause, Exception) and type(cause).__module__.startswith("rlcore"):
            raise cause from None
        raise ConfigError(f"the policy on group {group.name!r} failed to start: {str(cause).strip().splitlines()[-1]}") from None
    return RemotePolicy(actor, args[0] if args else kwargs.get("model"), kwargs.get("tokenizer"))


class _RayPlacer:
    """What :class:`~rlcore.loop.Policy` asks when built with ``remote_group=`` under ``mode="ray"``."""

    def place_policy(self, remote_group: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> "RemotePolicy | None":
        group = group_for(remote_group)
        return None if group is None else place_policy(group, args, kwargs)


class PolicyWorker:
    """The Ray actor holding a :class:`Policy`; :class:`RemotePolicy` forwards the loop's calls."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], torch_threads: int = 1) -> None:
        import torch

        from ..loop.policy import Policy

        torch.set_num_threads(max(1, int(torch_threads)))
        self.policy = Policy(*args, **kwargs)

    def ping(self) -> int:
        return self.policy.step

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = getattr(self.policy, method)(*args, **kwargs)
        return out.cpu() if hasattr(out, "cpu") else out

    def step(self) -> int:
        return self.policy.step

    def sync_to(self, sampler: Any, version: int | None) -> dict[str, float]:
        from ..loop.sync import sync_weights

        return sync_weights(self.policy, sampler, version=version)


class RemotePolicy:
    """A :class:`Policy` living in a Ray actor, called exactly like a local one."""

    is_remote = True

    def __init__(self, actor: Any, model: Any, tokenizer: Any = None) -> None:
        from ..training.components import load_tokenizer

        self.actor = actor
        self.tokenizer = load_tokenizer(model, tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (self.tokenizer.eos_token_id or 0))

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        from .runtime import require_ray

        ray = require_ray()
        try:
            return ray.get(self.actor.call.remote(method, args, kwargs), timeout=_STATE.timeout_s)
        except Exception as exc:  # noqa: BLE001 - rlcore errors raised in the actor come back as themselves
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception) and type(cause).__module__.startswith("rlcore"):
                raise cause from None
            raise

    @property
    def step(self) -> int:
        from .runtime import require_ray

        return int(require_ray().get(self.actor.step.remote(), timeout=_STATE.timeout_s))

    def forward_backward(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        return self._call("forward_backward", *args, **kwargs)

    def clip_grad_and_step(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        return self._call("clip_grad_and_step", *args, **kwargs)

    def logprobs(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("logprobs", *args, **kwargs)

    def ref_logprobs(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("ref_logprobs", *args, **kwargs)

    def weights(self, sampler: Any = None, *, lora: bool | None = None, to_cpu: bool = True) -> Any:
        from ..weights import sampler_accepts_lora

        if lora is None:  # asked here: a local sampler does not travel to the actor
            lora = sampler is not None and sampler_accepts_lora(sampler)
        return self._call("weights", None, lora=lora, to_cpu=True)

    def save(self, path: Any) -> str:
        return self._call("save", str(path))

    def load(self, path: Any) -> None:
        return self._call("load", str(path))

    def sync_to(self, sampler: Any, version: int | None = None) -> dict[str, float]:
        """Ray samplers get the weights straight from the policy's actor; a sampler in this process
        gets CPU copies fetched from it."""
        from .runtime import require_ray

        if hasattr(sampler, "sync_mode"):  # a RemoteSampler: picklable, the actor sends to the pool
            version = self.step if version is None else int(version)
            metrics = require_ray().get(self.actor.sync_to.remote(sampler, version), timeout=_STATE.timeout_s)
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
