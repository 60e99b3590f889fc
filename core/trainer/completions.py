"""TRL's ``log_completions``: every prompt, completion, reward column and advantage of a generation
(or an evaluation batch) appended to ``OUTPUT_DIR/completions.jsonl``, the first
``num_completions_to_print`` printed."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from ..rewards import reward_inputs, trl_reward_inputs
from ..types import Trajectory


def completion_records(trajs: Sequence[Trajectory], advantages: Sequence[Any], *, step: int, split: str,
                       extras: dict[str, list[Any]], extras_from: int = 0,
                       unique_prompts: bool = False) -> list[dict[str, Any]]:
    """One record per trajectory. ``trajs`` may be every rank's batch; ``extras`` (the reward
    functions' ``log_extra`` columns) are this rank's, starting at ``extras_from``.
    ``unique_prompts`` keeps the first completion of each distinct prompt (TRL's ``log_unique_prompts``)."""
    view = trl_reward_inputs(reward_inputs(list(trajs)))
    records = []
    for i, t in enumerate(trajs):
        adv = advantages[i] if i < len(advantages) else None
        rec: dict[str, Any] = {"step": step, "split": split,
                               "prompt": view["prompts"][i], "completion": view["completions"][i],
                               "rewards": dict(t.rewards), "reward": t.reward,
                               "advantage": adv if not isinstance(adv, list) else (adv[0] if adv else None),
                               "status": t.status}
        if t.has_turn_samples:  # the sequences this episode trains as (docs/chat-templates.md)
            rec["samples"] = [{"prompt_tokens": len(s.prompt_ids), "completion": "".join(turn.text for turn in s.turns)}
                              for s in t.turn_samples()]
        for column, values in extras.items():
            if 0 <= i - extras_from < len(values):
                rec[column] = values[i - extras_from]
        records.append(rec)
    if unique_prompts:
        seen: set[str] = set()
        records = [r for r in records if not (str(r["prompt"]) in seen or seen.add(str(r["prompt"])))]
    return records


def log_completions(args: Any, global_step: int, trajs: Sequence[Trajectory], advantages: Sequence[Any], *,
                    prefix: str = "", extras: dict[str, list[Any]], extras_from: int = 0) -> None:
    """Write (on the saving process) and print the records of ``trajs``. A training batch is
    generated for the optimizer step about to run: the step the progress bar and metrics.jsonl give
    it (it printed `[step 0]` beside the bar's step 1); evaluation (``prefix``) runs after a step and
    keeps that step's number."""
    if not args.should_save:  # only the saving process writes and prints: the others build nothing
        return
    records = completion_records(trajs, advantages, step=int(global_step) + (0 if prefix else 1),
                                 split=prefix or "train", extras=extras, extras_from=extras_from,
                                 unique_prompts=bool(args.log_unique_prompts))
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "completions.jsonl"), "a", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, default=str) + "\n")
    n = args.num_completions_to_print
    for rec in records[: len(records) if n is None else int(n)]:
        print(f"[step {rec['step']}] reward={rec['reward']} advantage={rec['advantage']}\n"
              f"  prompt: {str(rec['prompt'])[:200]}\n  completion: {str(rec['completion'])[:400]}")
