"""Why a run is not learning, in one line each, from the logged metrics.

Why: a run whose groups never differ in reward trains on all-zero advantages — loss 0, grad_norm 0
— and used to end ``reward 0.000 → 0.000`` with nothing else said; only ``metrics.jsonl`` showed
``advantage_zero_std_frac 1.0`` and ``completions/clipped_ratio 1.0``. :func:`diagnose` reads the
per-step records (what ``metrics.jsonl`` holds, or what the progress bar was logged) and names
what it sees, the likely causes and what to try. The summary of ``rlcore train`` prints its lines,
and the progress bar prints them once after :data:`MIN_STEPS` logged steps.

A verdict needs the sign in *every* logged step (a run that had a signal at some point is not
called dead). "Every completion cut at the length cap" alone is not a verdict — the built-in
``digits`` task learns with every completion at its 8-token cap — it is named as a cause when the
run also has no reward spread.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

#: logged steps before the progress bar says anything
MIN_STEPS = 3


def _num(row: dict[str, Any], key: str) -> float | None:
    v = row.get(key)
    if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
        return float(v)
    return None


def _all(rows: Sequence[dict[str, Any]], key: str, test: Any) -> bool:
    vals = [_num(r, key) for r in rows]
    return bool(vals) and all(v is not None and test(v) for v in vals)


def training_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of training steps (evaluation records carry only ``eval_*`` keys)."""
    return [r for r in rows if "reward" in r or "advantage_zero_std_frac" in r]


def diagnose(rows: Sequence[dict[str, Any]], args: Any = None, min_steps: int = 1) -> list[str]:
    """One line per problem seen in every one of ``rows`` (per-step metric records), most basic
    first; ``[]`` when the run has a learning signal. ``args`` (the run's GRPOConfig) lets the
    lines quote the settings to change."""
    rows = training_rows(rows)
    if len(rows) < max(1, min_steps):
        return []
    n = len(rows)
    steps = "the one logged step" if n == 1 else f"all {n} steps"
    lines: list[str] = []

    errors = {k.split("/", 1)[1]: sum(_num(r, k) or 0.0 for r in rows)
              for k in rows[-1] if k.startswith("reward_errors/")}
    for name, total in errors.items():
        if total > 0:
            hit = sum(1 for r in rows if (_num(r, f"reward_errors/{name}") or 0.0) > 0)
            lines.append(
                f"reward errors: reward {name!r} raised on {total:.0f} samples in {hit} of {n} steps "
                f"(reward_errors/{name}); those samples score nothing — its first traceback is printed above the "
                "bar: fix the reward, or the dataset column it reads"
            )

    cap = getattr(args, "max_completion_length", None)
    truncated = _all(rows, "completions/clipped_ratio", lambda v: v >= 0.999)
    cut = (f"every completion hit the length cap (max_completion_length={cap}, clipped_ratio 1.0), so an answer at "
           "the end never appears" if cap is not None else
           "every completion hit the length cap (clipped_ratio 1.0), so an answer at the end never appears")
    means = [_num(r, "reward") for r in rows]
    means_ok = [m for m in means if m is not None]
    identical = (_all(rows, "reward_std", lambda v: v <= 1e-9) and bool(means_ok)
                 and max(means_ok) - min(means_ok) <= 1e-9)
    no_spread = _all(rows, "advantage_zero_std_frac", lambda v: v >= 0.999)
    tries = []
    if truncated:
        tries.append(f"longer completions (--max-completion-length {int(cap) * 4})" if cap else
                     "longer completions (--max-completion-length)")
    tries.append("a --system-prompt that asks for the answer format the reward checks (e.g. '#### N' for gsm8k)")
    tries.append("a denser reward (partial credit, or a format reward beside the accuracy one)")
    gens = getattr(args, "num_generations", None)
    if no_spread and not identical:
        tries.append(f"more --num-generations{f' (now {gens})' if gens else ''} or a higher --temperature")
    tries.append("easier prompts")
    if identical:
        value = means_ok[0]
        why = "the reward never fires" if value == 0 else "the reward does not tell completions apart"
        causes = [c for c in (cut if truncated else "", "the prompts do not ask for what the reward checks") if c]
        lines.insert(0,
            f"no learning signal: every completion scored {value:.3f} in {steps} (reward_std 0), so every advantage "
            f"is 0 and the model cannot move — {why}; likely: {'; '.join(causes)}; try: {', '.join(tries)}"
        )
    elif no_spread:
        causes = [c for c in (cut if truncated else "",
                              "the prompts are too hard or too easy for the model (all wrong or all right)",
                              "too few or too similar generations per prompt") if c]
        lines.insert(0,
            f"no learning signal: no group of completions had any reward spread in {steps} "
            "(advantage_zero_std_frac 1.0), so every advantage is 0 and the model cannot move (grad_norm 0); "
            f"likely: {'; '.join(causes)}; try: {', '.join(tries)}"
        )
    return lines


def short(line: str) -> str:
    """The part of a diagnosis before its details (for the progress bar)."""
    return line.split(":", 1)[0]
