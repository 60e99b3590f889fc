"""Per-step metrics: what a generation batch looked like (rewards, lengths, turns, failures) and
what the optimizer saw (loss, KL, clipping, entropy, IS ratios), appended as one JSON line per
logged step to ``OUTPUT_DIR/metrics.jsonl`` so runs can be compared without any tracker."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections import defaultdict
from typing import Any, Sequence

METRICS_FILE = "metrics.jsonl"


#: Beyond this magnitude a square (or a sum) may overflow: means and spreads are then computed on
#: the values divided by the largest one (a reward of ±1e308 neither raises OverflowError nor
#: turns into inf on the way; only a result beyond the float range is inf, logged as null).
_HUGE = 1e150


def _clean(xs: Sequence[float]) -> tuple[list[float], float]:
    """The values without None and NaN, and the factor they are divided by (1 unless huge)."""
    vals = [float(x) for x in xs if x is not None and not math.isnan(x)]
    big = max((abs(x) for x in vals), default=0.0)
    if big < _HUGE or math.isinf(big):
        return vals, 1.0
    return [x / big for x in vals], big


def _mean(xs: Sequence[float]) -> float:
    vals, scale = _clean(xs)
    return scale * (sum(vals) / len(vals)) if vals else float("nan")


def _std(xs: Sequence[float]) -> float:
    vals, scale = _clean(xs)
    if len(vals) < 2:
        return 0.0
    m = sum(vals) / len(vals)
    return scale * math.sqrt(sum((x - m) ** 2 for x in vals) / (len(vals) - 1))


def rollout_metrics(trajectories: Sequence[Any], columns: dict[str, list[float | None]], zero_std_frac: float) -> dict[str, float]:
    """Metrics of one generation batch."""
    # failed trajectories (env down, timeout) have no meaningful reward: they are counted in
    # failed_trajectories / failed_fraction, never averaged in as 0.0
    ok = [i for i, t in enumerate(trajectories) if t.status != "failed"]
    rewards = [trajectories[i].reward if trajectories[i].reward is not None else float("nan") for i in ok]
    # a per-turn sample's prompt (the conversation re-rendered) is not completion: left out
    lengths = [sum(len(turn.token_ids) for turn in t.turns if not turn.is_restart) for t in trajectories]
    sampled = [sum(sum(turn.loss_mask) for turn in t.turns) for t in trajectories]
    out: dict[str, float] = {
        "reward": _mean(rewards),
        "reward_std": _std(rewards),
        "advantage_zero_std_frac": zero_std_frac,
        "completion_length": _mean(lengths) if lengths else 0.0,
        "completion_length/max": float(max(lengths)) if lengths else 0.0,
        "completion_length/min": float(min(lengths)) if lengths else 0.0,
        "num_turns": _mean([t.num_turns for t in trajectories]) if trajectories else 0.0,
        "failed_trajectories": float(len(trajectories) - len(ok)),
        "failed_fraction": (len(trajectories) - len(ok)) / len(trajectories) if trajectories else 0.0,
        "truncated_trajectories": float(sum(1 for t in trajectories if t.status == "truncated")),
        "sampled_tokens": float(sum(sampled)),
        # episodes and the sequences they train as (more than one each with per-turn samples)
        "episodes": float(len(trajectories)),
        "samples": float(sum(len(trajectories[i].turn_samples()) for i in ok)),
    }
    out.update(episode_metrics(trajectories))
    timeouts = [t.infos.get("tool_timeouts") for t in trajectories if t.infos.get("tool_timeouts") is not None]
    if timeouts:  # tool calls stopped at their deadline (tool_scheduler)
        out["tool_timeouts"] = float(sum(timeouts))
    for name, vals in columns.items():
        out[f"rewards/{name}"] = _mean([vals[i] if vals[i] is not None else float("nan") for i in ok])
    # TRL's reward keys leave failed trajectories out as well
    out.update(trl_rollout_metrics(trajectories, {name: [vals[i] for i in ok] for name, vals in columns.items()}, zero_std_frac))
    return out


def trl_rollout_metrics(trajectories: Sequence[Any], columns: dict[str, list[float | None]], zero_std_frac: float) -> dict[str, float]:
    """The generation-side keys TRL 1.16's ``GRPOTrainer`` logs (``_generate``,
    ``_generate_and_score_completions``), so TRL dashboards read rlcore runs. Lengths count the
    sampled tokens (TRL's ``tool_mask``); a completion is clipped when it hit the length limit."""
    lengths = [float(sum(sum(turn.loss_mask) for turn in t.turns)) for t in trajectories] or [0.0]
    clipped = [t.status == "truncated" for t in trajectories]
    terminated = [n for n, c in zip(lengths, clipped) if not c] or [0.0]
    out: dict[str, float] = {
        "completions/mean_length": sum(lengths) / len(lengths),
        "completions/min_length": min(lengths),
        "completions/max_length": max(lengths),
        "completions/clipped_ratio": sum(clipped) / len(clipped) if clipped else 0.0,
        "completions/mean_terminated_length": sum(terminated) / len(terminated),
        "completions/min_terminated_length": min(terminated),
        "completions/max_terminated_length": max(terminated),
        "frac_reward_zero_std": zero_std_frac,
    }
    if any("tool_calls" in t.infos for t in trajectories) or any(t.infos.get("tools") for t in trajectories):
        calls = sum(int(t.infos.get("tool_calls", 0)) for t in trajectories)
        errors = sum(int(t.infos.get("tool_errors", 0)) for t in trajectories)
        out["tools/call_frequency"] = calls / len(trajectories)
        out["tools/failure_frequency"] = errors / calls if calls else 0.0
    for name, vals in columns.items():
        clean = [v if v is not None else float("nan") for v in vals]
        out[f"rewards/{name}/mean"] = _mean(clean)
        out[f"rewards/{name}/std"] = _std(clean)
    return out


def episode_metrics(trajectories: Sequence[Any]) -> dict[str, float]:
    """How environment episodes went (only for batches from env schedulers, which record
    ``env_steps``): env steps taken, and what ended each episode — the env (``done``), the turn limit,
    a reply cut by length, or a failure — plus the share of assistant turns that ended by ``stop``."""
    if not any("env_steps" in t.infos for t in trajectories):
        return {}
    n = len(trajectories)
    ended = {"env_done": 0, "max_turns": 0, "length": 0, "failed": 0}
    for t in trajectories:
        if t.status == "failed":
            ended["failed"] += 1
        elif t.infos.get("env_done"):
            ended["env_done"] += 1
        elif t.infos.get("ended_by") in ended:
            ended[t.infos["ended_by"]] += 1
        elif t.status == "truncated":
            ended["length"] += 1
        else:
            ended["max_turns"] += 1
    sampled = [turn for t in trajectories for turn in t.turns if turn.loss_mask and turn.loss_mask[0] == 1]
    out = {"env_steps": float(sum(int(t.infos.get("env_steps", 0) or 0) for t in trajectories))}
    out.update({f"episodes_ended/{k}": v / n for k, v in ended.items()})
    out["turns_ended_by_stop"] = sum(1 for turn in sampled if turn.finish_reason == "stop") / len(sampled) if sampled else 0.0
    return out


class MetricAccumulator:
    """Averages train-side metrics over the micro-batches between two logs."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = defaultdict(float)
        self._counts: dict[str, int] = defaultdict(int)

    def add(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            if v is None or (isinstance(v, float) and math.isnan(v)):
                continue
            self._sums[k] += float(v)
            self._counts[k] += 1

    def pop(self) -> dict[str, float]:
        out = {k: self._sums[k] / self._counts[k] for k in self._sums if self._counts[k]}
        self._sums.clear()
        self._counts.clear()
        return out


class StepClock:
    """Wall time between two logged steps and what of it went to generation, with the tokens
    sampled meanwhile: a logged record's ``step_time``, ``rollout_time``, ``train_time`` (per
    optimizer step) and ``tokens_per_second``."""

    def __init__(self) -> None:
        self.started: float | None = None  # train() began (the first log's interval starts here)
        self.last_log: float | None = None
        self.last_step = 0
        self.rollout_time = 0.0
        self.sampled_tokens = 0.0

    def start(self) -> None:
        self.started = time.perf_counter()

    def generated(self, seconds: float, tokens: float) -> None:
        """A generation step took ``seconds`` and sampled ``tokens``."""
        self.rollout_time += seconds
        self.sampled_tokens += tokens

    def times(self, step: int, logging_steps: int) -> dict[str, float]:
        """The interval since the last log (the first one of a process, also after a resume:
        since ``start``, over at most ``logging_steps`` steps), then a new interval begins."""
        now = time.perf_counter()
        if self.last_log is None:
            steps = max(1, min(step, int(logging_steps)))
            elapsed = now - (self.started if self.started is not None else now)
        else:
            steps = max(1, step - self.last_step)
            elapsed = now - self.last_log
        out = {"step_time": elapsed / steps, "rollout_time": self.rollout_time / steps,
               "train_time": max(0.0, elapsed - self.rollout_time) / steps,
               "tokens_per_second": self.sampled_tokens / elapsed if elapsed > 0 else 0.0}
        self.rollout_time = self.sampled_tokens = 0.0
        self.last_log, self.last_step = now, step
        return out


def step_record(step: int, gen_metrics: dict[str, float], train: dict[str, float], logs: dict[str, float],
                times: dict[str, float]) -> dict[str, Any]:
    """A logged training step's line of metrics.jsonl: the generation's metrics, the train side's
    (averaged over the micro-batches), the Trainer's logs and the :class:`StepClock` times; the
    losses' usual keys are 0.0 when no micro-batch reported them."""
    record: dict[str, Any] = {"step": step, **gen_metrics, **train, **logs}
    record.pop("rollout_only_time", None)
    record.update(times)
    for key in ("clip_ratio/low", "clip_ratio/high", "kl", "entropy"):
        record.setdefault(key, 0.0)
    return record


def append_jsonl(output_dir: str, record: dict[str, Any]) -> None:
    """Append one record as one whole line: a torn tail left by a crash is cut first, and the line
    goes out in a single ``write`` on an ``O_APPEND`` descriptor, then is fsynced."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, METRICS_FILE)
    repair_jsonl(path)
    data = (strict_json(record) + "\n").encode("utf-8")
    try:  # O_NOFOLLOW: never through a symbolic link (that would append to a file outside the run)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        _refuse_or_raise(path, output_dir, exc)
        raise
    start = os.fstat(fd).st_size
    try:
        written = os.write(fd, data)
        while written < len(data):  # a short write (disk full, signal): finish the line
            written += os.write(fd, data[written:])
        os.fsync(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)  # no torn line left behind: the file keeps its whole lines
        _refuse_or_raise(path, output_dir, exc)
        raise
    finally:
        os.close(fd)


def _refuse_or_raise(path: str, output_dir: str, exc: OSError) -> None:
    """A link where ``metrics.jsonl`` goes, or no room to write it: one line (raised here)."""
    from .checkpoint import link_error, out_of_space, storage_error

    if os.path.islink(path):
        raise link_error(path) from None
    if out_of_space(exc):
        raise storage_error(path, output_dir, exc) from exc


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def strict_json(record: Any) -> str:
    """``record`` as strict JSON: NaN and ±inf (which ``json.dumps`` writes as the non-JSON tokens
    ``NaN``/``Infinity``) become ``null``, so every reader can parse every line."""
    return json.dumps(_finite_or_none(record), allow_nan=False)


def repair_jsonl(path: str) -> bool:
    """Cut a torn last line (no newline at the end: the process died mid-append). Returns whether
    anything was cut. Whole lines are never touched, nor is a file behind a symbolic link."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return False
    if size == 0:
        return False
    if os.path.islink(path):
        from .checkpoint import link_error

        raise link_error(path)
    with open(path, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return False
        # find the end of the last whole line
        pos, chunk = size, 1 << 16
        keep = 0
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            block = f.read(pos - start)
            i = block.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        f.truncate(keep)
    return True


def read_jsonl(output_dir: str, repair: bool = False) -> list[dict[str, Any]]:
    """Every logged record. A torn last line (crash mid-append) is skipped — and cut from the file
    when ``repair`` — and so is any line that is not a JSON object ."""
    path = os.path.join(output_dir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    if repair:
        repair_jsonl(path)
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a torn (or otherwise broken) line: the record is lost, the history is not
            if isinstance(row, dict):
                out.append(row)
    return out


def truncate_jsonl(output_dir: str, max_step: int) -> None:
    """On resume, drop lines logged after the checkpoint's step (they will be logged again) and a
    torn tail. Rewritten through a temporary file, so a crash here cannot lose the history."""
    path = os.path.join(output_dir, METRICS_FILE)
    if os.path.islink(path):
        from .checkpoint import link_error

        raise link_error(path)
    rows = [r for r in read_jsonl(output_dir, repair=True) if int(r.get("step", 0) or 0) <= max_step]
    if os.path.exists(path):
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(strict_json(r) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
