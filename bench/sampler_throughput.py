"""Throughput of the ``hf`` sampler: micro-batched vs one-by-one vs transformers' continuous batching.

For each model size and each concurrency level (1, 8, 64 requests in flight at once, like that many
trajectories waiting on their next turn) it measures generated tokens per second of:

- ``batched``    — ``HFSampler`` as shipped: concurrent requests gathered by arrival into one batch;
- ``one_by_one`` — the same sampler with ``max_batch_size=1`` (a forward loop per request; its
  throughput does not depend on how many wait, so at most ``--serial-cap`` requests are timed);
- ``continuous`` — transformers' ``model.generate_batch`` (continuous batching manager, paged cache).

All modes run in the same process side by side, so ratios are meaningful on a noisy machine.
Completions have a fixed length (no stop token) so every mode generates the same token count.

    python bench/sampler_throughput.py                      # tiny + small (~50M), 32 tokens
    python bench/sampler_throughput.py --sizes tiny --max-tokens 16

Writes ``bench/results/sampler_throughput.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from rlcore.sampling.hf import HFSampler
from rlcore.testing import SIZES, tiny_model_path
from rlcore.types import SamplingParams

RESULTS = Path(__file__).parent / "results"


def make_prompts(tokenizer: Any, n: int) -> list[list[int]]:
    """``n`` chat prompts of slightly different lengths (so batches really need padding)."""
    out = []
    for i in range(n):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Question {i}: what is {i} + {i * 3 % 17}? " + "think step by step " * (i % 4)}],
            tokenize=False, add_generation_prompt=True,
        )
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


async def run_sampler(sampler: HFSampler, prompts: list[list[int]], max_tokens: int) -> tuple[int, float]:
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, stop_token_ids=[-1])  # -1: never stops early
    start = time.perf_counter()
    outs = await asyncio.gather(*(sampler.generate(p, params.replace(seed=i)) for i, p in enumerate(prompts)))
    return sum(len(o.token_ids) for o in outs), time.perf_counter() - start


def run_continuous(model: Any, prompts: list[list[int]], max_tokens: int) -> tuple[int, float]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(max_new_tokens=max_tokens, do_sample=True, temperature=1.0, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(num_blocks=256, page_size=32, max_batch_tokens=1024, return_logprobs=True)
    start = time.perf_counter()
    out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb, warmup=False)
    return sum(len(o.generated_tokens) for o in out.values()), time.perf_counter() - start


def bench_size(size: str, levels: list[int], max_tokens: int, modes: list[str], threads: int, serial_cap: int, progress: Any, task: Any) -> list[dict[str, Any]]:
    path = tiny_model_path(size=size)
    batched = HFSampler(path, batch_window_ms=5, max_batch_size=max(levels), num_threads=threads)
    serial = HFSampler(batched.model, batched.tokenizer, max_batch_size=1, num_threads=threads)  # same weights
    params_m = sum(p.numel() for p in batched.model.parameters()) / 1e6
    rows = []
    asyncio.run(run_sampler(batched, make_prompts(batched.tokenizer, 2), 4))  # warm-up
    for level in levels:
        prompts = make_prompts(batched.tokenizer, level)
        for mode in modes:
            if mode == "batched":
                toks, secs = asyncio.run(run_sampler(batched, prompts, max_tokens))
            elif mode == "one_by_one":
                toks, secs = asyncio.run(run_sampler(serial, prompts[:serial_cap], max_tokens))
            else:
                try:
                    toks, secs = run_continuous(batched.model, prompts, max_tokens)
                except Exception as exc:  # noqa: BLE001 - report, keep benchmarking the rest
                    rows.append({"size": size, "params_m": params_m, "concurrency": level, "mode": mode,
                                 "error": f"{type(exc).__name__}: {exc}"})
                    progress.advance(task)
                    continue
            rows.append({"size": size, "params_m": round(params_m, 1), "concurrency": level, "mode": mode,
                         "tokens": toks, "seconds": round(secs, 3), "tokens_per_s": round(toks / secs, 1)})
            progress.advance(task)
    asyncio.run(batched.close())
    asyncio.run(serial.close())
    return rows


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["size"] for r in rows}, key=list(SIZES).index)
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        sub = [r for r in rows if r["size"] == size and "tokens_per_s" in r]
        levels = sorted({r["concurrency"] for r in sub})
        width = 0.8 / max(1, len(modes))
        for j, mode in enumerate(modes):
            vals = [next((r["tokens_per_s"] for r in sub if r["concurrency"] == c and r["mode"] == mode), 0) for c in levels]
            ax.bar([i + j * width for i in range(len(levels))], vals, width, label=mode)
        ax.set_xticks([i + width * (len(modes) - 1) / 2 for i in range(len(levels))], [str(c) for c in levels])
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("generated tokens / s")
        params = sub[0]["params_m"] if sub else "?"
        ax.set_title(f"hf sampler, {size} model ({params}M params)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    from rich.progress import Progress

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=list(SIZES))
    ap.add_argument("--levels", nargs="+", type=int, default=[1, 8, 64])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--modes", nargs="+", default=["batched", "one_by_one", "continuous"],
                    choices=["batched", "one_by_one", "continuous"])
    ap.add_argument("--serial-cap", type=int, default=8, help="most requests timed one by one")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads for every mode (1 is stable on a shared, oversubscribed machine)")
    ap.add_argument("--out", default=str(RESULTS / "sampler_throughput"))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)  # the continuous-batching manager's thread inherits the default
    rows: list[dict[str, Any]] = []
    with Progress() as progress:
        task = progress.add_task("sampler throughput", total=len(args.sizes) * len(args.levels) * len(args.modes))
        for size in args.sizes:
            progress.console.print(f"preparing the {size} model (built on first use)…")
            rows += bench_size(size, args.levels, args.max_tokens, args.modes, args.threads, args.serial_cap, progress, task)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "cpus": os.cpu_count(),
            "cuda": torch.cuda.is_available(), "machine": platform.machine(), "max_tokens": args.max_tokens,
            "threads": args.threads, "load_average": os.getloadavg()}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    plot(rows, out.with_suffix(".png"))
    for r in rows:
        print(f"{r['size']:>5} c={r['concurrency']:>3} {r['mode']:>10}: " + (f"{r['tokens_per_s']:8.1f} tok/s" if "tokens_per_s" in r else r["error"]))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
