"""Ray as an optional extra: import it only here, and start a light local instance when no
cluster address is given.

Why a guard: ``pip install rlcore`` must work without Ray (a large dependency); only
``--distributed ray`` needs it, and then a missing Ray is one clear line, not a traceback.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigError, MissingDependencyError

#: env vars forwarded to every worker so offline / quiet settings hold there too
_FORWARDED_ENV = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TOKENIZERS_PARALLELISM",
    "TRANSFORMERS_VERBOSITY",
    "HF_HUB_DISABLE_PROGRESS_BARS",
    "RLCORE_PLUGINS",
    "RLCORE_CACHE",
)


def require_ray() -> Any:
    """Return the ``ray`` module, or raise a one-line MissingDependencyError saying what to install."""
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(
            "Ray is not installed; `pip install 'rlcore[ray]'` to use --distributed ray"
        ) from None
    return ray


def worker_env() -> dict[str, str]:
    """The environment variables a worker process should share with the driver."""
    env = {k: os.environ[k] for k in _FORWARDED_ENV if k in os.environ}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def ensure_ray(address: str | None = None, *, num_cpus: float | None = None, num_gpus: float | None = None) -> Any:
    """Connect to ``address`` or start a local Ray instance (no dashboard, fractional-friendly).

    Reuses an instance that is already initialised in this process (tests share one per module).
    ``num_cpus`` is Ray's logical CPU count: on a 2-core machine asking for 4 is fine when actors
    reserve half a CPU each — it is bookkeeping for placement, not pinning.
    """
    ray = require_ray()
    if ray.is_initialized():
        return ray
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": os.environ.get("RLCORE_RAY_LOGS", "0") == "1",
        "runtime_env": {"env_vars": worker_env()},
        "configure_logging": False,
    }
    if address:
        try:
            ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"cannot join the Ray cluster at {address!r} ({first}); start one with `ray start --head` "
                "or drop --ray-address to run a local instance"
            ) from None
        return ray
    cpus = num_cpus if num_cpus is not None else float(os.cpu_count() or 1)
    init_kwargs: dict[str, Any] = {"num_cpus": int(max(1, -(-cpus // 1)))}
    if num_gpus is not None:
        init_kwargs["num_gpus"] = int(-(-num_gpus // 1))
    ray.init(**init_kwargs, **kwargs)
    return ray
