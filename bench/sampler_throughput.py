"""Throughput of the ``hf`` sampler: micro-batched vs one-by-one vs transformers' own generation.

For each model shape and each amount of work (``C`` requests in flight at once, like that many
trajectories waiting on their next turn, ``T`` tokens each) it measures generated tokens per second of:

- ``batched``    — ``HFSampler`` as shipped: concurrent requests gathered into one batch (on CUDA
  the static cache + CUDA-graph decode path, on CPU the dynamic loop);
- ``dynamic``    — the same sampler forced onto the dynamic loop (``decode="dynamic"``);
- ``static``     — forced onto the static path (``decode="static"``: graphs on CUDA, eager on CPU),
  with the fused decode forward for Llama-family models (:mod:`rlcore.sampling.hf.fused`);
- ``static_model`` — the static path running the model's own forward (``fused_decode=False``);
- ``static_unpacked`` — the fused forward with every projection its own matmul (``pack_projections=False``);
- ``one_by_one`` — the sampler with ``max_batch_size=1`` (a forward loop per request; its
  throughput does not depend on how many wait, so at most ``--serial-cap`` requests are timed);
- ``generate``   — ``model.generate`` on the left-padded batch (sampling, fixed length);
- ``continuous`` — transformers' ``model.generate_batch`` (continuous batching manager, paged cache).

All modes run in the same process side by side, so ratios are meaningful on a noisy machine; each
is warmed up once on the same work shortened to a few tokens (CUDA graphs captured, kernels
loaded) and timed ``--repeats`` times (the median is reported). Completions have a fixed length
(no stop token) so every mode generates the same token count.

    python bench/sampler_throughput.py                      # CPU: tiny + small (~50M), 32 tokens
    python bench/sampler_throughput.py --sizes tiny --max-tokens 16
    python bench/sampler_throughput.py --sizes qwen2-0.5b --device cuda --dtype bfloat16 \
        --work 64x128 256x256 --modes batched dynamic generate          # the GPU set (bench/gpu.sh)

Writes ``bench/results/sampler_throughput.json`` and ``.png`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from shapes import load_model, shape_names  # noqa: E402

from rlcore.sampling.hf.sampler import HFSampler  # noqa: E402
from rlcore.types import SamplingParams  # noqa: E402

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
    _sync(model)
    start = time.perf_counter()
    out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb, warmup=False)
    return sum(len(o.generated_tokens) for o in out.values()), time.perf_counter() - start


def run_generate(model: Any, tokenizer: Any, prompts: list[list[int]], max_tokens: int) -> tuple[int, float]:
    """``model.generate`` over the left-padded batch: sampling, every row exactly ``max_tokens``."""
    from transformers import GenerationConfig

    dev = next(model.parameters()).device
    L = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id or 0
    ids = torch.tensor([[pad] * (L - len(p)) + p for p in prompts], device=dev)
    attn = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts], device=dev)
    gen = GenerationConfig(max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=True, temperature=1.0,
                           top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=pad, bos_token_id=None)
    _sync(model)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=attn, generation_config=gen)
    _sync(model)
    return (out.shape[1] - L) * len(prompts), time.perf_counter() - start


def _sync(model: Any) -> None:
    if next(model.parameters()).device.type == "cuda":
        torch.cuda.synchronize()


def bench_size(size: str, work: list[tuple[int, int]], modes: list[str], a: argparse.Namespace, progress: Any,
               task: Any, save: Any = None) -> list[dict[str, Any]]:
    model, tok = load_model(size, a.device, a.dtype)
    biggest = max(c for c, _ in work)
    threads = a.threads
    samplers = {
        "batched": lambda: HFSampler(model, tok, batch_window_ms=5, max_batch_size=biggest, num_threads=threads),
        "dynamic": lambda: HFSampler(model, tok, batch_window_ms=5, max_batch_size=biggest, num_threads=threads, decode="dynamic"),
        "static": lambda: HFSampler(model, tok, batch_window_ms=5, max_batch_size=biggest, num_threads=threads, decode="static"),
        "static_model": lambda: HFSampler(model, tok, batch_window_ms=5, max_batch_size=biggest, num_threads=threads,
                                          decode="static", fused_decode=False),
        "static_unpacked": lambda: HFSampler(model, tok, batch_window_ms=5, max_batch_size=biggest, num_threads=threads,
                                             decode="static", pack_projections=False),
        "one_by_one": lambda: HFSampler(model, tok, max_batch_size=1, num_threads=threads),
    }
    live: dict[str, HFSampler] = {}
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    rows = []
    for level, max_tokens in work:
        prompts = make_prompts(tok, level)
        for mode in modes:
            def once(n_tokens: int) -> tuple[int, float]:
                if mode in samplers:
                    if mode not in live:
                        live[mode] = samplers[mode]()
                    ps = prompts[: a.serial_cap] if mode == "one_by_one" else prompts
                    return asyncio.run(run_sampler(live[mode], ps, n_tokens))
                if mode == "generate":
                    return run_generate(model, tok, prompts, n_tokens)
                return run_continuous(model, prompts, n_tokens)

            row: dict[str, Any] = {"size": size, "params_m": round(params_m, 1), "concurrency": level,
                                   "max_tokens": max_tokens, "mode": mode}
            try:
                t_warm = time.perf_counter()
                once(min(4, max_tokens))  # warm-up: graphs captured, kernels loaded, allocator grown
                row["warmup_s"] = round(time.perf_counter() - t_warm, 2)
                eng = getattr(live.get(mode), "_engine", None)
                kv0 = (getattr(eng, "kv_read_bytes", 0), getattr(eng, "kv_full_bytes", 0),
                       sum(getattr(eng, "steps_by_cols", {}).values()))
                runs = [once(max_tokens) for _ in range(a.repeats if mode in samplers else 1)]
            except Exception as exc:  # noqa: BLE001 - report, keep benchmarking the rest
                rows.append({**row, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"})
                progress.advance(task)
                continue
            tps = [t / s for t, s in runs]
            row.update(tokens=runs[0][0], seconds=round(statistics.median(s for _, s in runs), 3),
                       tokens_per_s=round(statistics.median(tps), 1), runs_tokens_per_s=[round(x, 1) for x in tps])
            eng = getattr(live.get(mode), "_engine", None)  # (an older rlcore, compared side by side, has none)
            if mode in ("batched", "static", "static_model", "static_unpacked"):
                row["decode"] = "cuda_graph" if eng is not None and eng.use_graphs else ("static" if eng else "dynamic")
                if eng is not None:
                    row["graphs"] = eng.captures
                    read, full = eng.kv_read_bytes - kv0[0], eng.kv_full_bytes - kv0[1]
                    if full:  # attention's key/value reads with column buckets, against whole slots
                        row["kv_read_fraction"] = round(read / full, 3)
                        row["kv_mb_per_step"] = round(read / 1e6 / max(1, sum(eng.steps_by_cols.values()) - kv0[2]), 1)
                    fused = getattr(eng, "fused", None)
                    row["forward"] = "model" if fused is None else ("fused, packed" if getattr(fused, "packed", False) else "fused")
            rows.append(row)
            if save is not None:
                save(rows)  # after every row: a run stopped by a time limit keeps what it measured
            progress.advance(task)
    for s in live.values():
        asyncio.run(s.close())
    return rows


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["size"] for r in rows}, key=shape_names().index)
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        sub = [r for r in rows if r["size"] == size and "tokens_per_s" in r]
        levels = sorted({(r["concurrency"], r["max_tokens"]) for r in sub})
        width = 0.8 / max(1, len(modes))
        for j, mode in enumerate(modes):
            vals = [next((r["tokens_per_s"] for r in sub if (r["concurrency"], r["max_tokens"]) == c and r["mode"] == mode), 0)
                    for c in levels]
            ax.bar([i + j * width for i in range(len(levels))], vals, width, label=mode)
        ax.set_xticks([i + width * (len(modes) - 1) / 2 for i in range(len(levels))], [f"{c}×{t}" for c, t in levels])
        ax.set_xlabel("concurrent requests × tokens each")
        ax.set_ylabel("generated tokens / s")
        params = sub[0]["params_m"] if sub else "?"
        ax.set_title(f"hf sampler, {size} model ({params}M params)")
        if any(r["tokens_per_s"] > 1000 for r in sub):
            ax.set_yscale("log")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    from rich.progress import Progress

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", "--shape", nargs="+", default=["tiny", "small"], choices=shape_names())
    ap.add_argument("--levels", nargs="+", type=int, default=[1, 8, 64])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--work", nargs="+", default=None, metavar="CxT",
                    help="concurrency x tokens pairs, e.g. 64x128 256x256 (instead of --levels/--max-tokens)")
    ap.add_argument("--modes", nargs="+", default=["batched", "one_by_one", "continuous"],
                    choices=["batched", "dynamic", "static", "static_model", "static_unpacked", "one_by_one", "generate",
                             "continuous"])
    ap.add_argument("--no-plot", action="store_true", help="write the JSON only")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs of the sampler modes (median reported)")
    ap.add_argument("--serial-cap", type=int, default=8, help="most requests timed one by one")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads for every mode (1 is stable on a shared, oversubscribed machine)")
    ap.add_argument("--out", default=str(RESULTS / "sampler_throughput"))
    args = ap.parse_args()
    work = ([tuple(int(x) for x in w.lower().split("x")) for w in args.work] if args.work
            else [(c, args.max_tokens) for c in args.levels])
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)  # the continuous-batching manager's thread inherits the default
    import transformers

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "transformers": transformers.__version__, "cpus": os.cpu_count(),
            "cuda": torch.cuda.is_available(), "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
            "device": args.device, "dtype": args.dtype, "machine": platform.machine(), "work": work,
            "threads": args.threads, "load_average": os.getloadavg()}
    done: list[dict[str, Any]] = []

    def save(new_rows: list[dict[str, Any]]) -> None:
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": done + new_rows}, indent=2))

    with Progress() as progress:
        task = progress.add_task("sampler throughput", total=len(args.sizes) * len(work) * len(args.modes))
        for size in args.sizes:
            progress.console.print(f"preparing the {size} model (built on first use)…")
            done += bench_size(size, work, args.modes, args, progress, task, save)
    rows = done
    save([])
    if not args.no_plot:
        plot(rows, out.with_suffix(".png"))
    for r in rows:
        print(f"{r['size']:>10} {r['concurrency']:>3}x{r['max_tokens']:<4} {r['mode']:>10}: "
              + (f"{r['tokens_per_s']:10.1f} tok/s" if "tokens_per_s" in r else r["error"]))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
