"""Scale out with Ray: a trainer group and a sampler group placed on their own workers, weight sync
from trainer to samplers, and optional async generation. Needs ``pip install 'rlcore[ray]'``.

Importing this package imports neither Ray nor torch (only starting workers does), so configs,
the CLI's flag parsing and docs tools work without them.
"""

from .layout import DistributedConfig, WorkerGroupConfig
from .failures import WorkerFailedError
from .groups import DeviceGroup, RemotePolicy, initialize, make_sampler, shutdown
from .pool import RemoteSampler
from .routing import bind_trajectory
from .runner import DistributedResult, run_distributed
from .staleness import filter_stale

__all__ = [
    "DeviceGroup",
    "DistributedConfig",
    "DistributedResult",
    "RemotePolicy",
    "RemoteSampler",
    "WorkerFailedError",
    "WorkerGroupConfig",
    "bind_trajectory",
    "filter_stale",
    "initialize",
    "make_sampler",
    "run_distributed",
    "shutdown",
]
