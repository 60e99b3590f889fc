"""Padding-free micro-batches (``padding_free=True``) vs padded ones: training-step time and peak
memory on a generation batch with a realistic, long-tailed length spread, side by side in one run.

The batch: ``--rows`` sequences whose prompts are GSM8K-like (normal around ``--prompt-mean``
tokens) and whose completions are log-normal with a long tail (median ``--completion-median``,
capped at ``--max-completion-length``, as sampled completions are). As in ``GRPOTrainer`` every row
is right-padded to the generation batch's longest row and the batch is cut into ``--micro``
micro-batches of the same rows; one step is the loss (grpo, with a KL term) and backward over all
of them. Step times come from one process in which the modes take turns (a load drift on a shared
machine hits them alike); each mode's peak memory from a fresh subprocess of its own. The modes:

- ``padded``: every micro-batch runs ``rows × T`` positions (``completion_logprobs(pack=False)``);
- ``row_packed``: rlcore's default before ``padding_free``: rows packed into fewer rows of width
  ``T`` where that saves a row (llama/mistral/qwen families only);
- ``padding_free``: the sequences end to end, rows of the longest sequence (sdpa/eager) or one row
  (flash-attention);
- ``padding_free_budget``: rows of ``--budget`` tokens.

Reported per mode: median step seconds, peak memory above the loaded model (CPU: resident set;
CUDA: ``max_memory_allocated``), positions the decoder ran, and each one's ratio to ``padded``.
The loss of every mode is printed beside the padded one (they agree to float rounding).

    python bench/padding_free.py                          # CPU: tiny + SmolLM2, 8 rows, about 8 minutes
    python bench/padding_free.py --models tiny --rows 32  # quicker
    python bench/padding_free.py --device cuda --dtype bfloat16 --models qwen2-0.5b smollm2 \\
        --rows 64 --prompt-mean 110 --completion-median 180 --max-completion-length 1024 --micro 4

Writes ``--out`` (default bench/results/padding_free).json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
MODES = ("padded", "row_packed", "padding_free", "padding_free_budget")


def lengths(rows: int, prompt_mean: float, completion_median: float, cap: int, seed: int) -> list[tuple[int, int]]:
    """(prompt, completion) token counts: prompts ~ N(mean, mean/4), completions log-normal (σ 0.7)."""
    import random

    rnd = random.Random(seed)
    out = []
    for _ in range(rows):
        p = max(8, int(rnd.gauss(prompt_mean, prompt_mean / 4)))
        c = max(1, min(cap, int(rnd.lognormvariate(0.0, 0.7) * completion_median)))
        out.append((p, c))
    return out


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _load(name: str, device: str, dtype: str, attn: str) -> object:
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, HERE)
    if name == "smollm2":
        from rlcore.testing.smollm2 import PREPARE_COMMAND, smollm2_path

        path = smollm2_path(download=False)
        if path is None:
            raise SystemExit(f"SmolLM2 is not on this machine: run `{PREPARE_COMMAND}` once")
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype), attn_implementation=attn)
    else:
        from shapes import load_model

        model, _ = load_model(name, device="cpu", dtype=dtype)
        if attn != model.config._attn_implementation:
            model.set_attn_implementation(attn)
    return model.to(device).train()


def setup(args: argparse.Namespace) -> tuple:
    """(model, micro-batches, the lengths) of this run, on ``args.device``."""
    import torch

    from rlcore.types import Batch

    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    model = _load(args.model, args.device, args.dtype, args.attn)
    vocab = int(model.config.vocab_size)
    spans = lengths(args.rows, args.prompt_mean, args.completion_median, args.max_completion_length, args.seed)
    T = max(p + c for p, c in spans)
    B = len(spans)
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(3, min(vocab, 30000), (B, T), generator=g)
    attn = torch.zeros(B, T, dtype=torch.long)
    cmask = torch.zeros(B, T)
    for i, (p, c) in enumerate(spans):
        attn[i, : p + c] = 1
        cmask[i, p : p + c] = 1
    adv = torch.randn(B, 1, generator=g).expand(B, T) * cmask
    batch = Batch(ids, attn, cmask, adv.contiguous(), torch.zeros(B, T), torch.ones(B, dtype=torch.bool)).to(dev)
    from rlcore.loop.loss import batch_logprobs

    own = batch_logprobs(model, batch, rows_per_pass=1)  # the reference: the model's own logprobs, a little off
    batch.ref_logps = (own + 0.05 * torch.randn(B, T, generator=g).to(dev)) * batch.completion_mask
    batch.sampler_logps = batch.ref_logps.clone()
    order = torch.randperm(B, generator=g)
    micro = [batch.select(c.to(dev)) for c in torch.tensor_split(order, args.micro)]
    return model, micro, spans


def make_step(args: argparse.Namespace, model: object, micro: list, mode: str) -> tuple:
    """(one training step of ``mode`` returning its loss, the decoder positions it runs)."""
    import rlcore.loop.loss as loss_mod
    from rlcore.algorithms.logprobs import PaddingFree, check_padding_free, completion_logprobs, packing_plan, padding_free_plan
    from rlcore.algorithms.losses import LossConfig
    from rlcore.plugins import get

    pf = {"padding_free": PaddingFree(), "padding_free_budget": PaddingFree(max_tokens=args.budget)}.get(mode)
    if pf is not None:
        check_padding_free(model)
    T = int(micro[0].input_ids.shape[1])
    positions = 0
    for mb in micro:
        if pf is not None:
            plan = padding_free_plan(model, mb.attention_mask, pf)
            positions += plan.rows * plan.width
        else:
            plan = packing_plan(model, mb.attention_mask, mb.completion_mask) if mode == "row_packed" else None
            positions += (plan.rows if plan is not None else mb.size) * T
    loss_fn, cfg = get("loss", "grpo"), LossConfig(beta=0.04)

    def unpacked(*a: object, **k: object) -> object:  # padded: the decoder on every padded position
        return completion_logprobs(*a, **{**k, "pack": False})

    def step() -> float:
        total = 0.0
        loss_mod.completion_logprobs = unpacked if mode == "padded" else completion_logprobs
        try:
            for mb in micro:
                loss, _ = loss_mod.batch_loss(model, mb, loss_fn, cfg, padding_free=pf)
                (loss / len(micro)).backward()
                total += float(loss.detach()) / len(micro)
        finally:
            loss_mod.completion_logprobs = completion_logprobs
        model.zero_grad(set_to_none=True)
        return total

    return step, positions


def _sync(args: argparse.Namespace) -> None:
    import torch

    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def memory_worker(args: argparse.Namespace, mode: str) -> dict:
    """Peak memory of ``mode``'s step above the loaded model and batch, in a process of its own."""
    import torch

    model, micro, spans = setup(args)
    step, positions = make_step(args, model, micro, mode)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        base = _rss_mib()
    loss = step()
    _sync(args)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024) - base
    return {"mode": mode, "peak_mib": peak, "positions": positions, "loss": loss}


def timing_worker(args: argparse.Namespace) -> dict:
    """Every mode's step time in one process, the modes taking turns (load drifts hit them alike)."""
    model, micro, spans = setup(args)
    steps = {m: make_step(args, model, micro, m)[0] for m in args.modes}
    times: dict[str, list[float]] = {m: [] for m in args.modes}
    for r in range(args.warmup + args.repeats):
        for m in args.modes:
            _sync(args)
            t0 = time.perf_counter()
            steps[m]()
            _sync(args)
            if r >= args.warmup:
                times[m].append(time.perf_counter() - t0)
    return {"times_s": times, "real_tokens": sum(p + c for p, c in spans), "padded_width": max(p + c for p, c in spans)}


def _sub(args: argparse.Namespace, worker: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", worker, "--model", args.model, "--modes", *args.modes]
    for k in ("device", "dtype", "attn", "rows", "prompt_mean", "completion_median", "max_completion_length", "micro",
              "budget", "warmup", "repeats", "seed", "threads"):
        cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_model(args: argparse.Namespace) -> list[dict]:
    timing = _sub(args, "timing")
    rows = []
    for m in args.modes:
        r = _sub(args, m)
        r["mode"] = m
        if "error" in timing:
            r.setdefault("error", timing["error"])
        elif "error" not in r:
            r["times_s"] = timing["times_s"][m]
            r["step_s"] = statistics.median(r["times_s"])
            r["real_tokens"], r["padded_width"] = timing["real_tokens"], timing["padded_width"]
        rows.append(r)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2"], help="tiny, small, qwen2-0.5b (shapes.py), smollm2")
    ap.add_argument("--model", default="tiny", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="auto", help="auto: cuda when available, else cpu")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa, eager, flash_attention_2)")
    ap.add_argument("--rows", type=int, default=None, help="generation batch rows (default: 8 on cpu, 64 on cuda)")
    ap.add_argument("--prompt-mean", type=float, default=None, help="default: 32 on cpu, 110 on cuda")
    ap.add_argument("--completion-median", type=float, default=None, help="default: 40 on cpu, 180 on cuda")
    ap.add_argument("--max-completion-length", type=int, default=None, help="default: 160 on cpu, 1024 on cuda")
    ap.add_argument("--micro", type=int, default=2, help="micro-batches per step (steps_per_generation)")
    ap.add_argument("--budget", type=int, default=None, help="padding_free_max_tokens of the budget mode (default 4×T/2)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: 1 on cpu — on a shared machine more threads wait on each other; 0: torch's default)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--out", default=os.path.join(RESULTS, "padding_free"))
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = args.device.startswith("cuda")
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    args.threads = (0 if gpu else 1) if args.threads is None else args.threads
    args.rows = args.rows or (64 if gpu else 8)
    args.prompt_mean = args.prompt_mean or (110.0 if gpu else 32.0)
    args.completion_median = args.completion_median or (180.0 if gpu else 40.0)
    args.max_completion_length = args.max_completion_length or (1024 if gpu else 160)
    if args.budget is None:
        spans = lengths(args.rows, args.prompt_mean, args.completion_median, args.max_completion_length, args.seed)
        args.budget = 2 * max(p + c for p, c in spans)
    if args.worker:
        print(json.dumps(timing_worker(args) if args.worker == "timing" else memory_worker(args, args.worker)))
        return
    import transformers

    spans = lengths(args.rows, args.prompt_mean, args.completion_median, args.max_completion_length, args.seed)
    report = {"meta": {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
                       "device": args.device, "gpu": torch.cuda.get_device_name() if gpu else None,
                       "cpus": os.cpu_count(), "load_average_start": list(os.getloadavg()), "dtype": args.dtype,
                       "attn_implementation": args.attn},
              "setup": {k: getattr(args, k) for k in ("rows", "prompt_mean", "completion_median", "max_completion_length",
                                                       "micro", "budget", "warmup", "repeats", "seed", "threads")},
              "lengths": {"total": [p + c for p, c in spans], "completion": [c for _, c in spans]},
              "results": {}}
    for name in args.models:
        args.model = name
        rows = run_model(args)
        base = next((r for r in rows if r["mode"] == "padded" and "error" not in r), None)
        for r in rows:
            if base is not None and "error" not in r:
                r["time_ratio"] = r["step_s"] / base["step_s"]
                r["memory_ratio"] = r["peak_mib"] / base["peak_mib"] if base["peak_mib"] > 0 else None
                r["positions_ratio"] = r["positions"] / base["positions"]
                r["loss_diff"] = abs(r["loss"] - base["loss"])
                r["loss_rel_diff"] = r["loss_diff"] / max(abs(base["loss"]), 1e-12)
            line = (f"{name:>10} {r['mode']:>20}: " + (r["error"] if "error" in r else
                    f"{r['step_s']:7.3f} s/step  peak {r['peak_mib']:8.1f} MiB  positions {r['positions']:6d}"
                    + (f"  (x{r['time_ratio']:.2f} time, x{r['memory_ratio'] or 0:.2f} memory, x{r['positions_ratio']:.2f} "
                       f"positions, |Δloss| {r['loss_diff']:.1e} of {abs(r['loss']):.3g})" if "time_ratio" in r else "")))
            print(line, flush=True)
        report["results"][name] = rows
    report["meta"]["load_average_end"] = list(os.getloadavg())
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=2)
    print("wrote", args.out + ".json")


if __name__ == "__main__":
    main()
