"""reasoning-gym data and scoring against one training step, in one run: generating 10,000 rows
(``--dataset reasoning_gym:…``) and scoring 10,000 completions with the ``reasoning_gym`` reward
(through rlcore's reward path: trajectories, ``compute_reward``), next to the median time of one
step of the default ``rlcore train`` (built-in tiny model and digits task, DEFAULT_TRAIN_CONFIG:
32 trajectories, 8 tokens). Steps and data work alternate so both see the same machine load. A
second yardstick: the median step at GRPOConfig's own defaults (TRL's: 8 completions of up to 256
tokens) with the same tiny model on a reasoning-gym dataset and the ``reasoning_gym`` reward.

Rows are generated when read, so two figures for data: ``create_s`` (``load_rows`` of a
10,000-row dataset, what a run pays up front) and ``generate_s`` (reading every row, i.e.
generating all 10,000, as an epoch does over many steps). ``score_reward_only_s`` is the reward's own ``score`` on plain lists (no trajectories), the
plugin's share of the scoring time. Scoring is timed warm (the entries were generated in this process, as in a training run) and cold
(entry cache cleared: every entry is regenerated from its ``(task, config, index)``, as when rows
come from a file written by another process). Writes bench/results/reasoning_gym_speed.json and .png.

    python bench/reasoning_gym_speed.py [--rows 10000] [--steps 6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
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
MIX = "leg_counting,basic_arithmetic,chain_sum,gcd,spell_backward,word_sorting,letter_counting,caesar_cipher,number_sorting,knights_knaves"
DATASETS = {"leg_counting": "reasoning_gym:leg_counting", "mix of 10 families": f"reasoning_gym:{MIX}"}


def generate(source: str, n: int, seed: int) -> tuple[float, float, list[dict[str, Any]]]:
    """(seconds to create the dataset, seconds to generate every row, the rows)."""
    from rlcore.data import load_rows

    t = time.perf_counter()
    lazy = load_rows(source, options={"size": n, "seed": seed, "progress": False})
    created = time.perf_counter()
    rows = list(lazy)
    return created - t, time.perf_counter() - created, rows


def score(rows: list[dict[str, Any]], cold: bool, direct: list[float] | None = None) -> float:
    """Score one completion per row (the reference in <answer> tags for even rows, a wrong one for odd)."""
    import rlcore
    from rlcore import RunHooks
    from rlcore.rewards import as_reward, compute_rewards
    from rlcore.types import Trajectory, Turn
    from rl_plugin_reasoning_gym import tasks

    trajs = []
    for i, r in enumerate(rows):
        text = f"Counting…\n<answer>{r['answer'] if i % 2 == 0 else 'x' + str(r['answer'])}</answer>"
        trajs.append(Trajectory(prompt_ids=[1], messages=[{"role": "user", "content": r["question"]}, {"role": "assistant", "content": text}],
                                data={k: v for k, v in r.items() if k != "prompt"}, turns=[Turn(token_ids=[2], loss_mask=[1], logprobs=[-1.0], text=text)],
                                status="ok", num_turns=1))
    if cold:
        tasks._entries.clear()
        tasks._datasets.clear()
    reward = as_reward("reasoning_gym", rlcore.get("reward", "reasoning_gym")())
    t = time.perf_counter()
    cols = asyncio.run(compute_rewards(RunHooks(reward, observers=False), trajs))
    wall = time.perf_counter() - t
    values = cols["reasoning_gym"]
    if direct is not None:  # the reward alone on plain lists: the plugin's share of the time above
        t = time.perf_counter()
        reward.score(completions=[tr.messages[-1]["content"] for tr in trajs], reasoning_gym=[r["reasoning_gym"] for r in rows],
                     answer=[r["answer"] for r in rows])
        direct.append(time.perf_counter() - t)
    refs = [v for v, r in zip(values[0::2], rows[0::2]) if isinstance(r["answer"], str)]
    assert refs and all(v == 1.0 for v in refs) and reward.errors == 0, "reference answers must score 1.0"
    return wall


class StepTimer:
    """Runs the default ``rlcore train`` step by step (a callback pauses it between steps)."""

    def __init__(self, steps: int, config: dict[str, Any] | None = None, rows: Any = None) -> None:
        import threading

        from transformers import TrainerCallback

        from rlcore.data.tasks import DEFAULT_TRAIN_CONFIG, digits_dataset
        from rlcore.testing import tiny_model_path
        from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer

        self.times: list[float] = []
        self.go = threading.Semaphore(0)
        self.done = threading.Semaphore(0)
        timer = self

        class Cb(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
                timer.go.acquire()
                timer._t = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
                timer.times.append(time.perf_counter() - timer._t)
                timer.done.release()

        cfg = dict(DEFAULT_TRAIN_CONFIG if config is None else config, max_steps=steps,
                   output_dir=tempfile.mkdtemp(prefix="rg-bench-"), plots=False, disable_tqdm=True, logging_steps=1000)
        self.trainer = GRPOTrainer(tiny_model_path(), args=GRPOConfig(**cfg),
                                   train_dataset=digits_dataset() if rows is None else rows, callbacks=[Cb()])
        self.thread = threading.Thread(target=self.trainer.train, daemon=True)
        self.thread.start()

    def step(self) -> float:
        self.go.release()
        self.done.acquire()
        return self.times[-1]


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["one training step\n(default rlcore train)", "one training step\n(GRPOConfig defaults)"]
    values = [result["train_step_s"], result["default_config_step_s"]]
    for name, d in result["datasets"].items():
        labels += [f"create {result['rows']:,}-row\ndataset\n{name}", f"generate all\n{result['rows']:,} rows\n{name}",
                   f"score {result['rows']:,}\n(warm)\n{name}", f"score {result['rows']:,}\n(cold)\n{name}"]
        values += [d["create_s"], d["generate_s"], d["score_warm_s"], d["score_cold_s"]]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.bar(range(len(values)), values, color=["#444", "#888"] + ["#7c7", "#3a7", "#37a", "#a73"] * len(result["datasets"]))
    ax.set_xticks(range(len(values)), labels, fontsize=7)
    ax.set_ylabel("seconds (median)")
    ax.set_title("reasoning-gym: data and scoring vs one default training step (same run)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=6, help="training steps timed (the first is warm-up)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--default-steps", type=int, default=2, help="steps timed at GRPOConfig's defaults (after one warm-up)")
    ap.add_argument("--out", default=os.path.join(RESULTS, "reasoning_gym_speed"))
    args = ap.parse_args()

    from rlcore.data import load_rows

    load_rows("reasoning_gym:leg_counting?size=1")  # import reasoning-gym once (seconds), outside the timings
    timer = StepTimer(args.steps + 1)
    timer.step()  # warm-up
    steps: list[float] = []
    measured: dict[str, dict[str, list[float]]] = {n: {"create_s": [], "generate_s": [], "score_warm_s": [], "score_cold_s": [], "score_reward_only_s": []} for n in DATASETS}
    for rep in range(max(args.repeats, args.steps)):
        if rep < args.steps:
            steps.append(timer.step())
        if rep < args.repeats:
            for name, source in DATASETS.items():
                c, g, rows = generate(source, args.rows, seed=rep)
                measured[name]["create_s"].append(c)
                measured[name]["generate_s"].append(g)
                measured[name]["score_warm_s"].append(score(rows, cold=False, direct=measured[name]["score_reward_only_s"]))
                measured[name]["score_cold_s"].append(score(rows, cold=True))
    timer.thread.join(timeout=600)
    # the second yardstick: a step at GRPOConfig's own defaults (TRL's: 8 completions of up to 256
    # tokens per step) on a reasoning-gym dataset with the reasoning_gym reward, same tiny model
    default_timer = StepTimer(args.default_steps + 1, config={"reward_funcs": ["reasoning_gym"], "save_strategy": "no",
                                                            "report_to": "none"},
                              rows=load_rows("reasoning_gym:leg_counting?size=64"))
    default_timer.step()  # warm-up
    default_steps = [default_timer.step() for _ in range(args.default_steps)]
    default_timer.thread.join(timeout=600)
    default_step = statistics.median(default_steps)
    step = statistics.median(steps)
    result: dict[str, Any] = {
        "rows": args.rows, "train_step_s": step, "train_steps_s": steps,
        "train_config": "rlcore train defaults (tiny model, digits task, 4 prompts x 8 generations, 8 tokens)",
        "default_config_step_s": default_step, "default_config_steps_s": default_steps,
        "default_config": "GRPOConfig defaults (TRL's: 1 prompt x 8 generations, up to 256 tokens), tiny model, "
                          "reasoning_gym:leg_counting, reward reasoning_gym",
        "datasets": {},
    }
    for name, m in measured.items():
        med = {k: statistics.median(v) for k, v in m.items()}
        result["datasets"][name] = {
            "source": DATASETS[name], **med, "runs": m,
            "create_over_step": med["create_s"] / step,
            "generate_over_step": med["generate_s"] / step,
            "generate_per_step_s": med["generate_s"] / args.rows * 4,  # the 4 prompts one default step draws
            "score_warm_over_step": med["score_warm_s"] / step,
            "score_reward_only_over_step": med["score_reward_only_s"] / step,
            "score_cold_over_step": med["score_cold_s"] / step,
            "generate_over_default_config_step": med["generate_s"] / default_step,
            "score_warm_over_default_config_step": med["score_warm_s"] / default_step,
        }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    plot(result, args.out + ".png")
    print(json.dumps({k: v for k, v in result.items() if k != "datasets"} | {
        n: {k: round(v, 3) for k, v in d.items() if isinstance(v, float)} for n, d in result["datasets"].items()}, indent=2))


if __name__ == "__main__":
    main()
