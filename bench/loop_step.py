"""One GRPO step written with the loop API (rlcore.loop) vs GRPOTrainer, in one run, on
``grpo_step.py``'s setup: the same tiny model (one built, then copied), tokenizer, prompts, reward
(``digits``), ``num_generations``, ``max_completion_length`` and ``loss_type``. The two run in
lock-step — one loop step, one trainer step, and so on — so both see the same machine load. A
trainer step is timed from ``on_step_begin`` to ``on_step_end``; a loop step from ``sync_weights``
to the end of ``clip_grad_and_step``; both include generation, rewards, advantages, logprobs,
backward and the optimizer step. Reports the median of each (after warm-up) and their ratio
(loop / trainer; the goal is <= 1.0 within noise). Writes bench/results/loop_step.json and .png.

    python bench/loop_step.py [--steps 12] [--warmup 2] [--prompts 4] [--num-generations 8] [--max-completion-length 32]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, HERE)

from grpo_step import Baton, add_step_args, plot_steps, run_in_lockstep, timing_callback, write_result  # noqa: E402  (the lock-step scheduler and the trainer's timer)


def run_loop(a: argparse.Namespace, model: Any, tok: Any, rows: list[dict], baton: Baton, times: list[float],
             rollout_times: list[float]) -> None:
    """The loop of docs/loop.md with the benchmark's settings; each step waits for its turn."""
    import rlcore
    from rlcore import SamplingParams
    from rlcore.loop import Policy, Rewards, Rollout, make_prompts, sync_weights

    policy = Policy(model.train(), tok, loss=a.loss_type, learning_rate=1e-5, beta=0.0, max_grad_norm=1.0,
                    disable_dropout=False)
    sampler = rlcore.get("sampler", "hf")(policy.model, tok, seed=0)
    rollout = Rollout(sampler, SamplingParams(max_tokens=a.max_completion_length, temperature=1.0))
    rewards = Rewards(["digits"])
    advantage = rlcore.get("advantage", "grpo")()
    for step in range(a.steps + a.warmup):
        chunk = [rows[(step * a.prompts + i) % len(rows)] for i in range(a.prompts)]
        baton.wait("loop")
        t0 = time.perf_counter()
        sync_weights(policy, sampler)
        trajectories = rollout(make_prompts(chunk, tok), num_generations=a.num_generations)
        adv = advantage(rewards(trajectories), num_generations=a.num_generations, scale="group")
        rollout_times.append(time.perf_counter() - t0)
        policy.forward_backward(trajectories, adv)
        policy.clip_grad_and_step()
        times.append(time.perf_counter() - t0)
        baton.pass_on()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_args(ap, steps=12, out="loop_step")
    a = ap.parse_args()

    import torch

    from rlcore.data.tasks import digits_dataset
    from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer
    from shapes import load_model

    rows = digits_dataset(256)
    model, tok = load_model(a.size, "cuda" if torch.cuda.is_available() else "cpu", "float32")
    twin = copy.deepcopy(model)
    baton = Baton(["loop", "trainer"])
    times: dict[str, list[float]] = {"loop": [], "trainer": []}
    loop_rollout: list[float] = []
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=os.path.join(out, "trainer"), reward_funcs=["digits"], per_device_train_batch_size=a.prompts * a.num_generations,
            num_generations=a.num_generations, max_completion_length=a.max_completion_length, loss_type=a.loss_type,
            max_steps=a.steps + a.warmup, learning_rate=1e-5, lr_scheduler_type="constant", beta=0.0, temperature=1.0,
            logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, seed=0, shuffle_dataset=False,
            plots=False,
        )
        trainer = GRPOTrainer(twin.train(), args=args, train_dataset=rows, processing_class=tok,
                              callbacks=[timing_callback("trainer", baton, times["trainer"])])
        run_in_lockstep(baton, {"loop": lambda: run_loop(a, model, tok, rows, baton, times["loop"], loop_rollout),
                                "trainer": trainer.train})
    med = {k: statistics.median(v[a.warmup:]) for k, v in times.items()}
    ratio = med["loop"] / med["trainer"]
    trainer_rollout = [h["rollout_time"] for h in trainer.state.log_history if "rollout_time" in h][a.warmup:]
    rollout_med = {"loop": statistics.median(loop_rollout[a.warmup:]),
                   "trainer": statistics.median(trainer_rollout) if trainer_rollout else None}
    print(f"median step time: loop API {med['loop']:.3f}s  GRPOTrainer {med['trainer']:.3f}s  ratio {ratio:.3f} "
          f"(goal <= 1.0); generation+scoring: loop {rollout_med['loop']:.3f}s, trainer {rollout_med['trainer']}")
    write_result(a, {"setup": vars(a), "median_step_s": med, "ratio_loop_over_trainer": ratio, "goal": 1.0,
                     "median_rollout_s": rollout_med, "step_times": times}, "float32")
    _plot(times, med, ratio, a)


def _plot(times: dict[str, list[float]], med: dict[str, float], ratio: float, a: argparse.Namespace) -> None:
    plot_steps(times, med, [("loop", "tab:green", "loop API"), ("trainer", "tab:blue", "GRPOTrainer")], a.warmup,
               f"GRPO step: loop API vs GRPOTrainer, {a.size}, {a.prompts}×{a.num_generations} completions "
               f"≤{a.max_completion_length} tok, {a.loss_type}: ratio {ratio:.2f}", a.out + ".png")


if __name__ == "__main__":
    main()
