"""rlcore's own exception types.

Every error a user can cause is raised as one of these with a single line that names the
culprit and says what to do. Tracebacks are for bugs; the CLI prints these as one line.
"""

from __future__ import annotations


def one_line(exc: BaseException) -> str:
    """``"Type: first line of the message"``: how a caught exception is recorded in a reason, a
    plugin record or a log line (one line, so reasons group and tables stay readable)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0] if text else type(exc).__name__


class RlcoreError(Exception):
    """Base class of every error a user can cause."""


class ConfigError(RlcoreError, ValueError):
    """A configuration value, flag or file is wrong."""


class UnknownComponentError(RlcoreError, KeyError):
    """A scheduler/env/reward/loss/advantage/sampler name that no plugin registers."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class PluginError(RlcoreError):
    """A plugin failed to import, or registered something invalid (e.g. a taken name)."""


class SamplerError(RlcoreError):
    """A generation backend failed or was used wrongly."""


class EnvError(RlcoreError):
    """An environment failed: reset/step raised, the server is down, or a session broke."""


class DatasetError(RlcoreError):
    """A dataset is missing, unreadable, or lacks the columns a run needs."""


class MissingDependencyError(RlcoreError, ImportError):
    """An optional dependency is not installed; the message says what to pip install."""


class RunFailedError(RlcoreError):
    """A run that can no longer mean anything: every trajectory failed, or most of them for several
    steps in a row. The run stops with a non-zero exit."""


class RewardFunctionError(RlcoreError):
    """A reward function raised on every sample of a batch: the run would train on nothing."""


class StorageError(RlcoreError):
    """Writing the run's output failed for want of room: the disk is full, a quota or a file size
    limit (``ulimit -f``) was reached. The message names the file and the room left."""
