"""What the trainer's per-batch rollout invariant check costs, as a share of a default
``rlcore train`` step, measured inside the same run (both numbers see the same machine load).

The default plan of ``rlcore train`` (built-in tiny model and task, its default config) trains for
``--steps`` steps after ``--warmup``; each step is timed from ``on_step_begin`` to ``on_step_end``
(generation, the check, scoring, logprobs, backward, optimizer), and each call of
``GRPOTrainer._check_batch`` (tokens vs rendering, prompt, logprobs, status, uuids on every
trajectory of the generation batch) is timed on its own. Reports total check time / total step
time over the measured steps (the target is < 2%). Writes bench/results/invariant_cost.json/.png.

    python bench/invariant_cost.py [--steps 10] [--warmup 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()

    from transformers import TrainerCallback

    from rlcore.commands.train import build_plan
    from rlcore.trainer.grpo import GRPOTrainer

    out = tempfile.mkdtemp(prefix="rlcore-invcost-")
    plan = build_plan(["--max_steps", str(a.steps + a.warmup), "--output_dir", out, "--save_strategy", "no",
                       "--report_to", "none", "--disable_tqdm", "true"])
    step_s: list[float] = []
    check_s: list[float] = []
    check_at: list[int] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step_s.append(time.perf_counter() - self.t0)

    trainer = GRPOTrainer(plan.model, args=plan.args, train_dataset=plan.rows, prompt_column=plan.prompt_column,
                          system_prompt=plan.system_prompt, callbacks=[Timer()])
    inner = trainer._check_batch

    def timed_check(trajs: list[Any]) -> None:
        t0 = time.perf_counter()
        inner(trajs)
        check_s.append(time.perf_counter() - t0)
        check_at.append(len(step_s))  # the step this generation batch belongs to

    trainer._check_batch = timed_check  # type: ignore[method-assign]
    trainer.train()
    steps = step_s[a.warmup:]
    checks = [c for c, at in zip(check_s, check_at) if at >= a.warmup]
    share = sum(checks) / sum(steps)
    result = {
        "steps": len(steps), "generation_batches": len(checks),
        "trajectories_per_batch": int(plan.args.prompts_per_generation * plan.args.num_generations),
        "median_step_s": statistics.median(steps), "median_check_s": statistics.median(checks) if checks else 0.0,
        "check_share_of_step_time": share, "target": 0.02,
    }
    print(json.dumps(result, indent=2))
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "invariant_cost.json"), "w") as f:
        json.dump(result, f, indent=2)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(["train step (median)", "invariant check (median)"], [result["median_step_s"] * 1e3, result["median_check_s"] * 1e3],
           color=["#888", "#2a7"])
    ax.set_ylabel("ms")
    ax.set_title(f"invariant check = {share:.2%} of step time (target < 2%)")
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "invariant_cost.png"))


if __name__ == "__main__":
    main()
