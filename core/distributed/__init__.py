"""Scale out with Ray: a trainer group and a sampler group placed on their own workers, weight sync
from trainer to samplers, and optional async generation. Needs ``pip install 'rlcore[ray]'``.

Importing this package does not import Ray (only the functions that start workers do), so configs
and docs tools work without it.
"""

from .config import DistributedConfig, WorkerGroupConfig
from .errors import WorkerFailedError
from .routing import bind_trajectory
from .staleness import filter_stale

__all__ = ["DistributedConfig", "WorkerFailedError", "WorkerGroupConfig", "bind_trajectory", "filter_stale"]
