"""``rlcore train --distributed ray …``: the flags that describe the layout, and the run.

Kept out of ``rlcore.commands.train`` so that file only has to hand over: these flags are split off
the command line here (no Ray or torch import), the rest is parsed as usual, and the resulting
plan is trained by :func:`rlcore.distributed.runner.run_distributed` instead of in-process.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

from ..errors import ConfigError
from ..distributed.layout import DistributedConfig, WorkerGroupConfig

#: flag -> (help, takes a value)
FLAGS: dict[str, tuple[str, bool]] = {
    "distributed": ("'ray': place trainer and sampler workers with Ray (pip install 'rlcore[ray]')", True),
    "ray_address": ("Ray cluster to join (e.g. 10.0.0.1:6379) [default: start a local one]", True),
    "num_trainer_workers": ("data-parallel trainer workers [default: 1]", True),
    "num_sampler_workers": ("sampler workers serving rollouts [default: 1]", True),
    "worker_device": ("cpu or gpu for both groups [default: gpu when CUDA is available]", True),
    "cpus_per_worker": ("CPUs each worker reserves (fractions allowed) [default: 1]", True),
    "gpus_per_worker": ("GPUs each worker reserves on gpu [default: 1]", True),
    "weight_sync": ("auto, object_store, broadcast (NCCL on GPU, gloo on CPU) or nccl [default: auto]", True),
    "sync_every": ("push weights to the samplers every K optimizer steps [default: 1]", True),
    "async_generation": ("roll out step t+1 while step t trains (off by default)", False),
    "max_staleness": ("async: drop trajectories more than K policy versions old [default: 1]", True),
}


def help_lines() -> list[str]:
    out = ["distributed options (rlcore train --distributed ray):"]
    for name, (text, _) in FLAGS.items():
        out.append(f"  --{name.replace('_', '-')}  {text}")
    return out


def split_distributed_flags(argv: Sequence[str]) -> tuple[DistributedConfig | None, list[str]]:
    """Take the distributed flags out of ``argv``; returns the layout (None without ``--distributed``)
    and the remaining arguments for the ordinary parser."""
    found: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    argv = list(argv)
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        key = name.replace("-", "_")
        if key not in FLAGS:
            rest.append(arg)
            i += 1
            continue
        _, takes_value = FLAGS[key]
        if takes_value and not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise ConfigError(f"--{name} needs a value")
            value = argv[i + 1]
            i += 1
        elif not takes_value:
            value = value if eq else "true"
        found[key] = value
        i += 1
    if not found:
        return None, rest
    mode = found.pop("distributed", None)
    if mode is None:
        raise ConfigError(f"--{next(iter(found)).replace('_', '-')} needs --distributed ray")
    if mode != "ray":
        raise ConfigError(f"--distributed {mode!r} is not supported; use --distributed ray")
    return _config(found), rest


def _config(f: dict[str, Any]) -> DistributedConfig:
    def num(key: str, cast: Any, default: Any) -> Any:
        if key not in f:
            return default
        try:
            return cast(f[key])
        except ValueError:
            raise ConfigError(f"--{key.replace('_', '-')} must be a number, got {f[key]!r}") from None

    device = f.get("worker_device") or _default_device()
    cpus = num("cpus_per_worker", float, 1.0)
    gpus = num("gpus_per_worker", float, None)

    def group(n_key: str) -> WorkerGroupConfig:
        return WorkerGroupConfig(num_workers=num(n_key, int, 1), device=device, num_cpus=cpus, num_gpus=gpus)

    flag = str(f.get("async_generation", "false")).lower()
    if flag not in ("true", "false", "1", "0", "yes", "no"):
        raise ConfigError(f"--async-generation takes no value (or true/false), got {flag!r}")
    return DistributedConfig(
        trainer=group("num_trainer_workers"),
        sampler=group("num_sampler_workers"),
        address=f.get("ray_address"),
        weight_sync=f.get("weight_sync", "auto"),
        sync_every=num("sync_every", int, 1),
        async_generation=flag in ("true", "1", "yes"),
        max_staleness=num("max_staleness", int, 1),
    ).validate()


def _default_device() -> str:
    try:
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        return "cpu"


def run_distributed_plan(plan: Any, config: DistributedConfig) -> Any:
    """Train a :class:`rlcore.commands.train.TrainPlan` over Ray and print the same kind of summary."""
    from rich.console import Console
    from rich.table import Table

    from ..distributed.runner import run_distributed
    from ..distributed.runtime import require_ray

    require_ray()
    args = plan.args  # its routed component options are already merged (train_cli.apply_component_options)
    config.sampler_name = args.sampler  # each sampler worker hosts the configured backend
    config.sampler_options = dict(args.sampler_options)
    console = Console()
    t, s = config.trainer, config.sampler
    console.print(
        f"[bold]rlcore train --distributed ray[/] · {t.num_workers} trainer + {s.num_workers} sampler workers "
        f"on {t.device} · weight sync {config.resolved_weight_sync}"
        + (f" · async (max_staleness {config.max_staleness})" if config.async_generation else "")
    )
    started = time.perf_counter()
    result = run_distributed(
        plan.model, args, plan.rows, config,
        prompt_column=plan.prompt_column, system_prompt=plan.system_prompt,
        resume_from_checkpoint=args.resume_from_checkpoint or None,
    )
    logs = [h for h in result.log_history if "loss" in h]
    table = Table(title="done", show_header=False, expand=False)
    table.add_row("steps", str(result.global_step))
    rewards = [h["reward"] for h in logs if h.get("reward") is not None]
    if rewards:
        table.add_row("reward (first → last)", f"{rewards[0]:.3f} → {rewards[-1]:.3f}")
    syncs = [m["sync/seconds"] for m in result.sync_history]
    if syncs:
        table.add_row("weight sync", f"{len(syncs)} × {sum(syncs) / len(syncs) * 1000:.0f} ms")
    table.add_row("time", f"{time.perf_counter() - started:.0f}s")
    table.add_row("metrics", os.path.join(result.output_dir, "metrics.jsonl"))
    console.print(table)
    return result
