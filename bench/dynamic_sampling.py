"""Dynamic sampling (DAPO) side by side in one run: groups with a learning signal per generated token.

Three trainers on the same tiny model, prompts, reward and seed, ``max_steps`` steps each:

* ``off`` — plain GRPO: every drawn group trains, flat ones included (advantage 0: no signal);
* ``full_refill`` — dynamic sampling whose every extra round rolls out a whole generation batch
  (verl's ``filter_groups``: ``gen_batch_size`` prompts per extra batch; the surplus dropped);
* ``adaptive`` — rlcore's ``dynamic_sampling=True``: an extra round draws what the spread rate seen
  so far says is missing.

The prompts are three kinds of rows, as a real dataset's are for a given model: ``easy`` (every
completion scores 1: flat), ``impossible`` (every completion scores 0: flat) and ``learnable``
(a completion scores 1 when the sum of its token ids is even: groups of ``num_generations`` are
flat only by chance). Reported per variant: groups with spread trained, completion tokens sampled
(every round), their ratio (groups with signal per 1,000 generated tokens), the share of trained
groups that had signal, rounds per step, and wall seconds per group with signal. The variants run
one after the other for each seed, in turn, so they share the machine's load.

    python bench/dynamic_sampling.py [--steps 8] [--seeds 2] [--learnable 0.3] [--num-generations 4]
    python bench/dynamic_sampling.py --model smollm2 --steps 4 --seeds 1 --max-completion-length 16 \
        --out bench/results/dynamic_sampling_smollm2.json      # SmolLM2-135M-Instruct (rlcore.testing.smollm2)

Writes bench/results/dynamic_sampling.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def kind_reward(completion_ids: list[list[int]], kind: list[str]) -> list[float]:
    return [1.0 if k == "easy" else 0.0 if k == "impossible" else float(sum(ids) % 2 == 0)
            for ids, k in zip(completion_ids, kind)]


def make_rows(n: int, learnable: float) -> list[dict[str, Any]]:
    n_learn = round(n * learnable)
    n_easy = (n - n_learn) // 2
    kinds = ["learnable"] * n_learn + ["easy"] * n_easy + ["impossible"] * (n - n_learn - n_easy)
    return [{"prompt": f"Question {i}: say something.", "kind": k} for i, k in enumerate(kinds)]


def model_path(name: str) -> str:
    if name == "tiny":
        from rlcore.data.demo import tiny_model_path

        return tiny_model_path()
    if name == "smollm2":
        from rlcore.testing.smollm2 import smollm2_path

        path = smollm2_path()
        if path is None:
            raise SystemExit("SmolLM2 is not on this machine: run `python -m rlcore.testing.smollm2` once")
        return path
    return name


def run(variant: str, seed: int, a: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    import rlcore
    import rlcore.trainer.grpo as trainer_module
    from rlcore.training.dynamic_sampling import DynamicSampling

    class FullRefill(DynamicSampling):
        """verl's refill: every extra round is a whole generation batch."""

        def next_draw(self) -> int:
            return 0 if self.done else self.groups

    original = trainer_module.DynamicSampling
    trainer_module.DynamicSampling = FullRefill if variant == "full_refill" else DynamicSampling
    try:
        with tempfile.TemporaryDirectory() as out:
            args = rlcore.GRPOConfig(
                output_dir=out, num_generations=a.num_generations, per_device_train_batch_size=a.num_generations * a.groups,
                max_completion_length=a.max_completion_length, max_steps=a.steps, learning_rate=1e-4, seed=seed,
                save_strategy="no", report_to="none", plots=False, disable_tqdm=True, use_cpu=True,
                dynamic_sampling=variant != "off", max_resample_rounds=a.max_resample_rounds)
            t = rlcore.GRPOTrainer(model_path(a.model), reward_funcs=[kind_reward], args=args, train_dataset=rows)
            trained: list[tuple[int, int]] = []  # (groups trained, of which with spread) per step
            generate = t._generate_and_score

            def recording() -> Any:
                micro = generate()
                groups: dict[str, list[float]] = {}
                for tr in t.whole_batch.trajectories:
                    groups.setdefault(tr.group_id, []).append(float(tr.reward))
                spread = sum(1 for g in groups.values() if max(g) > min(g))
                trained.append((0, 0) if getattr(t, "_gen_metrics", {}).get("dynamic_sampling/skipped") else
                               (len(groups), spread))
                return micro

            t._generate_and_score = recording
            t0 = time.perf_counter()
            t.train()
            wall = time.perf_counter() - t0
            logs = [h for h in t.state.log_history if "sampled_tokens" in h]
    finally:
        trainer_module.DynamicSampling = original
    tokens = sum(h["sampled_tokens"] for h in logs)
    n_trained = sum(g for g, _ in trained)
    signal = sum(s for _, s in trained)
    return {
        "variant": variant, "seed": seed, "steps": len(logs), "trained_groups": n_trained, "signal_groups": signal,
        "generated_tokens": tokens, "generated_groups": sum(h.get("dynamic_sampling/generated_groups", a.groups) for h in logs),
        "signal_groups_per_1k_tokens": 1000.0 * signal / tokens if tokens else 0.0,
        "trained_signal_share": signal / n_trained if n_trained else 0.0,
        "rounds_per_step": sum(h.get("dynamic_sampling/rounds", 1.0) for h in logs) / max(1, len(logs)),
        "seconds": wall, "seconds_per_signal_group": wall / signal if signal else float("inf"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="tiny (rlcore's tiny random model), smollm2, or a model path")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--learnable", type=float, default=0.3, help="share of learnable rows (the rest: half easy, half impossible)")
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--groups", type=int, default=4, help="groups per step (prompts_per_generation)")
    p.add_argument("--max-completion-length", type=int, default=8)
    p.add_argument("--max-resample-rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=os.path.join(RESULTS, "dynamic_sampling.json"))
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    rows = make_rows(a.rows, a.learnable)
    variants = ("off", "full_refill", "adaptive")
    runs = [run(v, seed, a, rows) for seed in range(a.seeds) for v in variants]
    summary: dict[str, Any] = {}
    for v in variants:
        mine = [r for r in runs if r["variant"] == v]
        signal = sum(r["signal_groups"] for r in mine)
        tokens = sum(r["generated_tokens"] for r in mine)
        seconds = sum(r["seconds"] for r in mine)
        summary[v] = {
            "signal_groups": signal, "trained_groups": sum(r["trained_groups"] for r in mine), "generated_tokens": tokens,
            "signal_groups_per_1k_tokens": 1000.0 * signal / tokens if tokens else 0.0,
            "trained_signal_share": signal / max(1, sum(r["trained_groups"] for r in mine)),
            "rounds_per_step": sum(r["rounds_per_step"] for r in mine) / len(mine),
            "seconds_per_signal_group": seconds / signal if signal else float("inf"),
        }
    base = summary["off"]
    for v in variants:
        s = summary[v]
        s["signal_per_token_vs_off"] = s["signal_groups_per_1k_tokens"] / base["signal_groups_per_1k_tokens"] \
            if base["signal_groups_per_1k_tokens"] else float("nan")
        s["seconds_per_signal_group_vs_off"] = s["seconds_per_signal_group"] / base["seconds_per_signal_group"]
    result = {"config": vars(a), "summary": summary, "runs": runs}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"{'variant':<12} {'signal/trained':>15} {'signal per 1k tok':>18} {'rounds':>7} {'s per signal group':>19} "
          f"{'vs off':>7}")
    for v in variants:
        s = summary[v]
        print(f"{v:<12} {s['signal_groups']:>7}/{s['trained_groups']:<7} {s['signal_groups_per_1k_tokens']:>18.2f} "
              f"{s['rounds_per_step']:>7.2f} {s['seconds_per_signal_group']:>19.3f} {s['seconds_per_signal_group_vs_off']:>7.2f}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
