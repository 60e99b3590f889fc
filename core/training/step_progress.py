"""A Rich progress bar over optimizer steps that shows the latest reward (replaces tqdm's), and
says once, after a few steps, why a run cannot learn (:mod:`rlcore.training.diagnosis`)."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback


class RichProgressCallback(TrainerCallback):
    def __init__(self) -> None:
        self.progress: Any = None
        self.task: Any = None
        self.last: dict[str, float] = {}
        self.rows: list[dict[str, float]] = []  # every logged training step, for the diagnosis
        self.warned: set[str] = set()
        self.warning = ""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero or self.progress is not None:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("[bold]GRPO"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            transient=False,
        )
        self.task = self.progress.add_task("train", total=state.max_steps, completed=state.global_step, info="")
        self.progress.start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if self.progress is None or not logs or "reward" not in logs:
            return
        self.last = dict(logs)
        self.rows.append(dict(logs))
        self._diagnose(args)
        r = logs.get("reward")
        info = f"reward {r:.3f}" if isinstance(r, (int, float)) else ""
        turns = logs.get("num_turns")
        if isinstance(turns, (int, float)) and turns > 1 and "completions/mean_length" in logs:
            # multi-turn: completion_length counts the env's observations too; show the turns and
            # the tokens the model sampled per trajectory instead
            info += f" · turns {turns:.1f} · sampled {logs['completions/mean_length']:.1f}"
        elif "completion_length" in logs:
            info += f" · len {logs['completion_length']:.1f}"
        if self.warning:
            info += f" · [yellow]⚠ {self.warning}[/]"
        self.progress.update(self.task, info=info)

    def _diagnose(self, args: Any) -> None:
        """After MIN_STEPS logged steps: each problem seen in every step so far is printed once above
        the bar, and the first one's headline stays on the bar while it holds."""
        from .diagnosis import MIN_STEPS, diagnose, short

        lines = diagnose(self.rows, args, min_steps=MIN_STEPS)
        for line in lines:
            if short(line) not in self.warned:  # once per kind of problem (its counts move on)
                self.warned.add(short(line))
                self.progress.console.print(f"⚠ {line}", style="yellow", markup=False, soft_wrap=True, highlight=False)
        self.warning = short(lines[0]) if lines else ""

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stop()

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
