"""Rollout throughput with 1 vs 2 Ray sampler workers on the CPU (the scale-out ratio).

One local Ray instance, two sampler actors (one torch thread each) hosting the same model. The
same rollout — ``--trajectories`` single-turn trajectories of exactly ``--max-tokens`` tokens,
driven by ``run_rollouts`` through a ``RemoteSampler`` — is timed over a pool of worker 0 only and
over a pool of both workers, alternating ``--repeats`` times so machine noise hits both alike.
Reported: sampled tokens per second for each, and the ratio 2 workers / 1 worker.

What to expect: on a machine with at least two free cores the ratio approaches 2 for a model whose
forward pass dominates (``small``); with the ``tiny`` model per-request overhead dominates and the
ratio is lower. On a shared 2-core box the second worker competes with everything else.

    python bench/scale.py                  # small (~50M) model, 32 trajectories x 16 tokens
    python bench/scale.py --size tiny --trajectories 64

Writes ``bench/results/scale.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def make_prompts(tokenizer: Any, n: int) -> list[Any]:
    from rlcore.types import Prompt

    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"Question {i}: what is {i} + {i * 3 % 17}? " + "think step by step " * (i % 4)}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(Prompt(messages=msgs, prompt_ids=tokenizer.encode(text, add_special_tokens=False)))
    return out


async def timed_rollout(pool: Any, prompts: list[Any], max_tokens: int) -> tuple[int, float]:
    from rlcore.rollout import RolloutScheduler, run_rollouts
    from rlcore.types import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, stop_token_ids=[-1])  # never stops early
    sched = RolloutScheduler(pool, sampling_params=params)
    start = time.perf_counter()
    result = await run_rollouts(sched, prompts, num_generations=1, progress=False)
    wall = time.perf_counter() - start
    bad = [t.reason for t in result.trajectories if t.status == "failed"]
    if bad:
        raise RuntimeError(f"rollout failed: {bad[0]}")
    return sum(t.num_completion_tokens for t in result.trajectories), wall


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    labels = ["1 sampler worker", "2 sampler workers"]
    values = [summary["tokens_per_s_1"], summary["tokens_per_s_2"]]
    bars = ax.bar(labels, values, color=["#888888", "#2a7ab9"])
    for b, v in zip(bars, values):
        ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.0f}", ha="center", va="bottom")
    ax.set_ylabel("sampled tokens / s (median)")
    ax.set_title(f"Ray rollout throughput ({summary['size']} model, CPU)\nratio 2/1 = {summary['ratio']:.2f}x")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small", choices=["tiny", "small"])
    ap.add_argument("--trajectories", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "scale"))
    args = ap.parse_args()

    import ray
    from rich.progress import Progress

    from rlcore.distributed import DistributedConfig, WorkerGroupConfig
    from rlcore.distributed.cluster import start_samplers
    from rlcore.distributed.pool import RemoteSampler
    from rlcore.distributed.runtime import ensure_ray
    from rlcore.testing import tiny_model_path

    model = tiny_model_path(size=args.size)
    cfg = DistributedConfig(sampler=WorkerGroupConfig(num_workers=2, num_cpus=1.0, torch_threads=1), worker_timeout_s=600)
    ensure_ray(num_cpus=max(2, os.cpu_count() or 1))
    placed, both = start_samplers(cfg, model, seed=0)
    one = RemoteSampler(both.workers[:1], both.tokenizer, timeout_s=600)
    prompts = make_prompts(both.tokenizer, args.trajectories)
    rows: list[dict[str, Any]] = []
    try:
        asyncio.run(timed_rollout(both, prompts[:4], 2))  # warm both workers up
        with Progress() as bar:
            task = bar.add_task("rollouts", total=2 * args.repeats)
            for r in range(args.repeats):
                for workers, pool in ((1, one), (2, both)):
                    tokens, wall = asyncio.run(timed_rollout(pool, prompts, args.max_tokens))
                    rows.append({"workers": workers, "repeat": r, "tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall})
                    bar.advance(task)
    finally:
        placed.remove()
        ray.shutdown()

    def med(w: int) -> float:
        return statistics.median(x["tokens_per_s"] for x in rows if x["workers"] == w)

    summary = {"size": args.size, "tokens_per_s_1": med(1), "tokens_per_s_2": med(2)}
    summary["ratio"] = summary["tokens_per_s_2"] / summary["tokens_per_s_1"]
    meta = {
        "cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
        "trajectories": args.trajectories, "max_tokens": args.max_tokens, "repeats": args.repeats,
        "torch_threads_per_worker": 1, "load_avg_at_end": os.getloadavg()[0],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": rows}, indent=2))
    plot(summary, out.with_suffix(".png"))
    print(json.dumps(summary, indent=2))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
