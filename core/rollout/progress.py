"""A rich progress bar over trajectories: done / total, turns so far, failures. Disable-able."""

from __future__ import annotations

from typing import Any


class RolloutProgress:
    """Context manager; ``advance(trajectories)`` once per finished trajectory (or its splits)."""

    def __init__(self, total: int, enabled: bool = True, description: str = "rollout") -> None:
        self.total = total
        self.enabled = enabled and total > 0
        self.turns = 0
        self.failed = 0
        self._progress: Any = None
        self._task: Any = None
        self.description = description

    def __enter__(self) -> "RolloutProgress":
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("turns {task.fields[turns]}  failed {task.fields[failed]}"),
                TimeElapsedColumn(),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self.total, turns=0, failed=0)
        return self

    def advance(self, trajectories: list[Any]) -> None:
        self.turns += sum(int(getattr(t, "num_turns", 0) or 0) for t in trajectories)
        self.failed += sum(1 for t in trajectories if getattr(t, "status", "") == "failed")
        if self._progress is not None:
            self._progress.update(self._task, advance=1, turns=self.turns, failed=self.failed)

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
