"""One GRPO step, rlcore vs TRL 1.16's GRPOTrainer, in one run: the same tiny model, prompts,
reward, ``num_generations``, ``max_completion_length`` and ``loss_type``. The two trainers run in
lock-step — one step of rlcore, one step of TRL, and so on — so both see the same machine load
(these machines are noisy); each step is timed from ``on_step_begin`` to ``on_step_end`` and
includes generation, scoring, logprobs, backward and the optimizer step. We report the median
step time of each side (after warm-up steps) and their ratio. Writes bench/results/grpo_step.json
and .png.

    python bench/grpo_step.py [--steps 20] [--warmup 2] [--num-generations 8] [--max-completion-length 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
    from rlcore.tasks import digits_reward

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return digits_reward(texts, answer)


def build(a: argparse.Namespace, model_dir: str, rows: list[dict], out: str, baton: Baton) -> dict[str, Any]:
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    from rlcore.trainer import GRPOConfig, GRPOTrainer

    common = dict(
        per_device_train_batch_size=a.prompts * a.num_generations, num_generations=a.num_generations,
        max_completion_length=a.max_completion_length, loss_type=a.loss_type, max_steps=a.steps + a.warmup,
        learning_rate=1e-5, beta=0.0, temperature=1.0, logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True, seed=0,
    )
    times = {"rlcore": [], "trl": []}
    ours = GRPOTrainer(model_dir, args=GRPOConfig(output_dir=os.path.join(out, "rlcore"), reward_funcs=["digits"], **common),
                       train_dataset=rows, callbacks=[timing_callback("rlcore", baton, times["rlcore"])])
    tok = AutoTokenizer.from_pretrained(model_dir)
    trl_rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in rows]
    theirs = TRLTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=trl_reward,
        # float32 on both sides
        args=TRLConfig(output_dir=os.path.join(out, "trl"), bf16=False, **common),
        train_dataset=datasets.Dataset.from_list(trl_rows),
        processing_class=tok, callbacks=[timing_callback("trl", baton, times["trl"])],
    )
    return {"trainers": {"rlcore": ours, "trl": theirs}, "times": times}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-completion-length", type=int, default=32)
    ap.add_argument("--loss-type", default="dapo")
    ap.add_argument("--size", default="tiny", help="rlcore.testing model size (tiny, small)")
    a = ap.parse_args()

    from rlcore.tasks import digits_dataset
    from rlcore.testing import tiny_model_path

    model_dir = tiny_model_path(size=a.size)
    rows = digits_dataset(256)
    baton = Baton(["rlcore", "trl"])
    with tempfile.TemporaryDirectory() as out:
        built = build(a, model_dir, rows, out, baton)
        errors: dict[str, BaseException] = {}

        def run(name: str) -> None:
            try:
                built["trainers"][name].train()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors[name] = exc
            finally:
                baton.finish(name)

        threads = [threading.Thread(target=run, args=(n,)) for n in ("rlcore", "trl")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise SystemExit(f"benchmark failed: {errors}")
    times = built["times"]
    med = {k: statistics.median(v[a.warmup:]) for k, v in times.items()}
    ratio = med["rlcore"] / med["trl"]
    print(f"median step time: rlcore {med['rlcore']:.3f}s  TRL {med['trl']:.3f}s  ratio {ratio:.3f} (goal <= 0.7)")
    result = {"setup": vars(a), "median_step_s": med, "ratio": ratio, "goal": 0.7, "step_times": times}
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "grpo_step.json"), "w") as f:
        json.dump(result, f, indent=2)
    _plot(times, med, ratio, a)


def _plot(times: dict[str, list[float]], med: dict[str, float], ratio: float, a: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for name, color in (("rlcore", "tab:blue"), ("trl", "tab:gray")):
        ax.plot(range(1, len(times[name]) + 1), times[name], marker="o", ms=3, color=color,
                label=f"{name} (median {med[name]:.3f}s)")
    ax.axvspan(0.5, a.warmup + 0.5, color="k", alpha=0.06, label="warm-up (excluded)")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title(f"GRPO step time, {a.prompts}×{a.num_generations} completions ≤{a.max_completion_length} tok, "
                 f"{a.loss_type}: ratio {ratio:.2f}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "grpo_step.png"))


if __name__ == "__main__":
    main()
