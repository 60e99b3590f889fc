"""Peak memory of logprobs + loss + backward at a real vocabulary (151,936, Qwen2.5's), 8 × 1,024
tokens: rlcore's chunked selective logprobs vs TRL's computation (full logits from the lm_head,
then TRL's ``selective_log_softmax``). Each side runs in a fresh subprocess; we report the peak
resident memory above the baseline after the inputs exist (CPU) or ``max_memory_allocated`` above
the baseline (CUDA). Writes bench/results/logprob_memory.json and .png.

    python bench/logprob_memory.py [--hidden 896] [--dtype bfloat16] [--chunk 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(side: str, batch: int, tokens: int, vocab: int, hidden: int, dtype_name: str, chunk: int, device: str) -> dict:
    import torch

    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    dev = torch.device(device)
    h = (torch.randn(batch, tokens, hidden, device=dev) * 0.5).to(dtype).requires_grad_(True)
    w = (torch.randn(vocab, hidden, device=dev) * 0.02).to(dtype).requires_grad_(True)
    targets = torch.randint(0, vocab, (batch, tokens), device=dev)
    adv = torch.randn(batch, device=dev)
    mask = torch.ones(batch, tokens, device=dev)
    temperature = 0.9
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        base = _rss_mib()
    t0 = time.perf_counter()
    if side == "rlcore":
        from rlcore.algorithms.logprobs import selective_logprobs

        lp, _ = selective_logprobs(h.reshape(-1, hidden), w, targets.reshape(-1), temperature=temperature, chunk_size=chunk)
        logps = lp.view(batch, tokens)
    else:
        from trl.trainer.utils import selective_log_softmax

        logits = h @ w.t()  # what the model's lm_head returns
        logits = logits / temperature
        logps = selective_log_softmax(logits, targets)
    # the same on-policy loss on both sides (dapo-style token mean)
    ratio = torch.exp(logps - logps.detach())
    loss = -(ratio * adv[:, None] * mask).sum() / mask.sum()
    loss.backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    return {"side": side, "peak_extra_mib": peak - base, "baseline_mib": base, "peak_mib": peak,
            "seconds": time.perf_counter() - t0, "loss": float(loss)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--device", default="cuda" if _cuda() else "cpu")
    ap.add_argument("--worker", default=None)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.batch, a.tokens, a.vocab, a.hidden, a.dtype, a.chunk, a.device)))
        return
    results = {}
    for side in ("rlcore", "trl"):
        cmd = [sys.executable, __file__, "--worker", side] + [f"--{k}={v}" for k, v in
               dict(batch=a.batch, tokens=a.tokens, vocab=a.vocab, hidden=a.hidden, dtype=a.dtype, chunk=a.chunk, device=a.device).items()]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{side} worker failed: {proc.stderr[-2000:]}")
        results[side] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{side:7s} peak extra {results[side]['peak_extra_mib']:9.1f} MiB  ({results[side]['seconds']:.1f}s)")
    ratio = results["rlcore"]["peak_extra_mib"] / results["trl"]["peak_extra_mib"]
    print(f"ratio rlcore/TRL = {ratio:.3f} (goal <= 0.5)")
    out = {"setup": vars(a) | {"worker": None}, "results": results, "ratio": ratio, "goal": 0.5}
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "logprob_memory.json"), "w") as f:
        json.dump(out, f, indent=2)
    _plot(results, ratio, a)


def _plot(results: dict, ratio: float, a: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4), dpi=110)
    sides = ["rlcore", "trl"]
    vals = [results[s]["peak_extra_mib"] / 1024 for s in sides]
    ax.bar(["rlcore (chunked)", "TRL (full logits)"], vals, color=["tab:blue", "tab:gray"])
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.2f} GiB", ha="center", va="bottom")
    ax.set_ylabel("peak extra memory (GiB)")
    ax.set_title(f"logprobs+loss+backward, V={a.vocab}, {a.batch}×{a.tokens} tok\nratio {ratio:.2f} ({a.dtype}, {a.device})")
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "logprob_memory.png"))


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


if __name__ == "__main__":
    main()
