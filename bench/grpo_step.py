"""One GRPO step, rlcore vs TRL 1.16's GRPOTrainer, in one run: the same tiny model, prompts,
reward, ``num_generations``, ``max_completion_length`` and ``loss_type``. The two trainers run in
lock-step — one step of rlcore, one step of TRL, and so on — so both see the same machine load
(these machines are noisy); each step is timed from ``on_step_begin`` to ``on_step_end`` and
includes generation, scoring, logprobs, backward and the optimizer step. We report the median
step time of each side (after warm-up steps) and their ratio. Writes bench/results/grpo_step.json
and .png.

    python bench/grpo_step.py [--steps 20] [--warmup 2] [--num-generations 8] [--max-completion-length 32]
    python bench/grpo_step.py --shape qwen2-0.5b --prompts 8 --max-completion-length 256 \
        --steps 3 --warmup 1 [--bf16] --out results/grpo_step_gpu_fp32         # on a GPU (bench/gpu.sh)

Both trainers get the same randomly initialised weights (one model built, then copied) and the same
tokenizer; ``--bf16`` turns on mixed precision (``bf16=True``) on both sides, fp32 otherwise. For
rlcore the per-step rollout time (generation + rewards) is reported beside the step time.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


class Baton:
    """Lets exactly one trainer run a step at a time, alternating A, B, A, B …"""

    def __init__(self, order: list[str]) -> None:
        self.order = order
        self.turn = 0
        self.cv = threading.Condition()
        self.done: set[str] = set()

    def wait(self, name: str) -> None:
        with self.cv:
            self.cv.wait_for(lambda: self._current() == name)

    def _current(self) -> str | None:
        live = [n for n in self.order if n not in self.done]
        if not live:
            return None
        while self.order[self.turn % len(self.order)] in self.done:
            self.turn += 1
        return self.order[self.turn % len(self.order)]

    def pass_on(self) -> None:
        with self.cv:
            self.turn += 1
            self.cv.notify_all()

    def finish(self, name: str) -> None:
        with self.cv:
            self.done.add(name)
            self.cv.notify_all()


def timing_callback(name: str, baton: Baton, times: list[float]) -> Any:
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            baton.wait(name)
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            times.append(time.perf_counter() - self.t0)
            baton.pass_on()

    return Timer()


def trl_reward(completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float]:
    from rlcore.data.tasks import digits_reward

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return digits_reward(texts, answer)


def build(a: argparse.Namespace, rows: list[dict], out: str, baton: Baton) -> dict[str, Any]:
    import datasets
    import torch
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer

    sys.path.insert(0, HERE)
    from shapes import load_model

    model, tok = load_model(a.size, "cuda" if torch.cuda.is_available() else "cpu", "float32")
    twin = copy.deepcopy(model)

    common = dict(
        per_device_train_batch_size=a.prompts * a.num_generations, num_generations=a.num_generations,
        max_completion_length=a.max_completion_length, loss_type=a.loss_type, max_steps=a.steps + a.warmup,
        learning_rate=1e-5, beta=0.0, temperature=1.0, logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, seed=0, bf16=a.bf16,
    )
    times = {"rlcore": [], "trl": []}
    ours = GRPOTrainer(model.train(), args=GRPOConfig(output_dir=os.path.join(out, "rlcore"), reward_funcs=["digits"], **common),
                       train_dataset=rows, processing_class=tok, callbacks=[timing_callback("rlcore", baton, times["rlcore"])])
    trl_rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in rows]
    theirs = TRLTrainer(
        model=twin.train(), reward_funcs=trl_reward,
        # the same precision on both sides (float32, or bf16 mixed precision with --bf16)
        args=TRLConfig(output_dir=os.path.join(out, "trl"), **common),
        train_dataset=datasets.Dataset.from_list(trl_rows),
        processing_class=tok, callbacks=[timing_callback("trl", baton, times["trl"])],
    )
    return {"trainers": {"rlcore": ours, "trl": theirs}, "times": times}


def add_step_args(ap: argparse.ArgumentParser, steps: int, out: str) -> None:
    """The setup flags every step benchmark shares (this one and loop_step.py)."""
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, default=32)
    ap.add_argument("--loss-type", default="dapo")
    ap.add_argument("--size", "--shape", default="tiny", help="model shape: tiny, small (rlcore.testing) or qwen2-0.5b")
    ap.add_argument("--out", default=os.path.join(RESULTS, out), help="JSON/PNG path without suffix")


def run_in_lockstep(baton: Baton, jobs: dict[str, Any]) -> None:
    """Run each job (name -> callable) in its own thread, the baton alternating their steps; a job
    that raises ends the benchmark with its error."""
    errors: dict[str, BaseException] = {}

    def run(name: str) -> None:
        try:
            jobs[name]()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors[name] = exc
        finally:
            baton.finish(name)

    threads = [threading.Thread(target=run, args=(n,)) for n in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"benchmark failed: {errors}")


def write_result(a: argparse.Namespace, result: dict[str, Any], precision: str) -> None:
    import torch
    import transformers

    result["meta"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                      "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "precision": precision}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(result, f, indent=2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_args(ap, steps=20, out="grpo_step")
    ap.add_argument("--bf16", action="store_true", help="bf16 mixed precision on both sides (default float32)")
    a = ap.parse_args()

    from rlcore.data.tasks import digits_dataset

    rows = digits_dataset(256)
    baton = Baton(["rlcore", "trl"])
    with tempfile.TemporaryDirectory() as out:
        built = build(a, rows, out, baton)
        run_in_lockstep(baton, {n: built["trainers"][n].train for n in ("rlcore", "trl")})
    times = built["times"]
    med = {k: statistics.median(v[a.warmup:]) for k, v in times.items()}
    ratio = med["rlcore"] / med["trl"]
    import torch

    history = built["trainers"]["rlcore"].state.log_history
    rollout = [h["rollout_time"] for h in history if "rollout_time" in h][a.warmup:]
    rollout_med = statistics.median(rollout) if rollout else None
    goal = 0.5 if torch.cuda.is_available() else 0.7
    print(f"median step time: rlcore {med['rlcore']:.3f}s  TRL {med['trl']:.3f}s  ratio {ratio:.3f} (goal <= {goal})"
          + (f"; rlcore rollout {rollout_med:.3f}s of its step" if rollout_med is not None else ""))
    write_result(a, {"setup": vars(a), "median_step_s": med, "ratio": ratio, "goal": goal,
                     "rlcore_median_rollout_s": rollout_med, "step_times": times}, "bf16 mixed" if a.bf16 else "float32")
    _plot(times, med, ratio, a)


def plot_steps(times: dict[str, list[float]], med: dict[str, float], series: list[tuple[str, str, str]], warmup: int,
               title: str, path: str) -> None:
    """Step times of two runs side by side (``series``: key, colour, label), warm-up shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for name, color, label in series:
        ax.plot(range(1, len(times[name]) + 1), times[name], marker="o", ms=3, color=color,
                label=f"{label} (median {med[name]:.3f}s)")
    ax.axvspan(0.5, warmup + 0.5, color="k", alpha=0.06, label="warm-up (excluded)")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def _plot(times: dict[str, list[float]], med: dict[str, float], ratio: float, a: argparse.Namespace) -> None:
    plot_steps(times, med, [("rlcore", "tab:blue", "rlcore"), ("trl", "tab:gray", "trl")], a.warmup,
               f"GRPO step, {a.size} {'bf16' if a.bf16 else 'fp32'}, {a.prompts}×{a.num_generations} completions "
               f"≤{a.max_completion_length} tok, {a.loss_type}: ratio {ratio:.2f}", a.out + ".png")


if __name__ == "__main__":
    main()
