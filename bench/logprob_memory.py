"""Peak memory of logprobs + loss + backward at a real vocabulary (151,936, Qwen2.5's), 8 × 1,024
tokens: rlcore's chunked selective logprobs vs TRL's computation (full logits from the lm_head,
then TRL's ``selective_log_softmax``). Each side runs in a fresh subprocess; we report the peak
resident memory above the baseline after the inputs exist (CPU) or ``max_memory_allocated`` above
the baseline (CUDA). Writes bench/results/logprob_memory.json and .png.

``--entropy-bonus`` adds the entropy bonus (TRL's ``entropy_coef``: ``loss -= coef × mean entropy``,
with the entropy's gradient) as more rows of the same run, so its cost reads side by side with the
default path: ``rlcore_default`` (what the trainer runs without the bonus: chunked logprobs plus the
detached entropy for the metric), ``rlcore_entropy_bonus`` (chunked, entropy with gradient),
``trl_entropy_bonus`` (full logits + ``entropy_from_logits``, autograd), and ``trl_fused_entropy_bonus``
(TRL 1.16's own chunked ``ChunkedLogProbFunction`` with ``outputs=("entropy",)``, the kernel its
trainer uses). Written to ``--out`` (default bench/results/logprob_memory[_entropy]).

    python bench/logprob_memory.py [--hidden 896] [--dtype bfloat16] [--chunk 1024]
    python bench/logprob_memory.py --entropy-bonus --batch 2 --tokens 1024
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
    # imports before the baseline: the rows measure the computation, not loading a library
    if side.startswith("rlcore"):
        import rlcore.algorithms.logprobs  # noqa: F401
    else:
        import trl.kernels  # noqa: F401
        import trl.trainer.utils  # noqa: F401
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        base = _rss_mib()
    t0 = time.perf_counter()
    ent = None
    if side in ("rlcore", "rlcore_default", "rlcore_entropy_bonus"):
        from rlcore.algorithms.logprobs import selective_logprobs

        lp, ent = selective_logprobs(h.reshape(-1, hidden), w, targets.reshape(-1), temperature=temperature, chunk_size=chunk,
                                     entropy=side == "rlcore_default", entropy_grad=side == "rlcore_entropy_bonus")
        logps = lp.view(batch, tokens)
        ent = ent.view(batch, tokens) if ent is not None else None
    elif side == "trl_fused_entropy_bonus":
        from trl.kernels import ChunkedLogProbFunction
        from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE  # the vocabulary tile TRL's trainer uses

        lp, ent, *_ = ChunkedLogProbFunction.apply(h.reshape(-1, hidden), w, None, targets.reshape(-1), temperature,
                                                   _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, ("log_probs", "entropy"))
        logps, ent = lp.view(batch, tokens), ent.view(batch, tokens)
    else:
        from trl.trainer.utils import entropy_from_logits, selective_log_softmax

        logits = h @ w.t()  # what the model's lm_head returns
        logits = logits / temperature
        logps = selective_log_softmax(logits, targets)
        if side == "trl_entropy_bonus":
            ent = entropy_from_logits(logits)
    # the same on-policy loss on every side (dapo-style token mean), minus the entropy bonus where on
    ratio = torch.exp(logps - logps.detach())
    loss = -(ratio * adv[:, None] * mask).sum() / mask.sum()
    if side.endswith("entropy_bonus"):
        loss = loss - 0.01 * (ent * mask).sum() / mask.sum()
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
    ap.add_argument("--entropy-bonus", action="store_true", help="add the entropy-bonus rows (and rlcore_default)")
    ap.add_argument("--out", default=None, help="JSON/PNG path without suffix")
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.batch, a.tokens, a.vocab, a.hidden, a.dtype, a.chunk, a.device)))
        return
    a.out = a.out or os.path.join(RESULTS, "logprob_memory_entropy" if a.entropy_bonus else "logprob_memory")
    sides = ["rlcore", "trl"]
    if a.entropy_bonus:
        sides = ["rlcore", "rlcore_default", "rlcore_entropy_bonus", "trl", "trl_entropy_bonus", "trl_fused_entropy_bonus"]
    results = {}
    for side in sides:
        cmd = [sys.executable, __file__, "--worker", side] + [f"--{k}={v}" for k, v in
               dict(batch=a.batch, tokens=a.tokens, vocab=a.vocab, hidden=a.hidden, dtype=a.dtype, chunk=a.chunk, device=a.device).items()]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{side} worker failed: {proc.stderr[-2000:]}")
        results[side] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{side:24s} peak extra {results[side]['peak_extra_mib']:9.1f} MiB  ({results[side]['seconds']:.1f}s)")
    ratio = results["rlcore"]["peak_extra_mib"] / results["trl"]["peak_extra_mib"]
    print(f"ratio rlcore/TRL = {ratio:.3f} (goal <= 0.5)")
    out = {"setup": vars(a) | {"worker": None}, "results": results, "ratio": ratio, "goal": 0.5}
    if a.entropy_bonus:
        base = results["rlcore_default"]
        bonus = results["rlcore_entropy_bonus"]
        out["entropy_bonus"] = {
            "memory_ratio_bonus_over_default": bonus["peak_extra_mib"] / base["peak_extra_mib"],
            "time_ratio_bonus_over_default": bonus["seconds"] / base["seconds"],
            "memory_ratio_rlcore_over_trl_full_logits": bonus["peak_extra_mib"] / results["trl_entropy_bonus"]["peak_extra_mib"],
            "memory_ratio_rlcore_over_trl_fused": bonus["peak_extra_mib"] / results["trl_fused_entropy_bonus"]["peak_extra_mib"],
            "loss_rlcore_vs_trl_fused": [bonus["loss"], results["trl_fused_entropy_bonus"]["loss"]],
        }
        print("entropy bonus: " + ", ".join(f"{k} {v:.3f}" for k, v in out["entropy_bonus"].items() if isinstance(v, float)))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(out, f, indent=2)
    _plot(results, ratio, a)


def _plot(results: dict, ratio: float, a: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"rlcore": "rlcore\n(chunked)", "trl": "TRL\n(full logits)", "rlcore_default": "rlcore\ndefault",
              "rlcore_entropy_bonus": "rlcore\n+bonus", "trl_entropy_bonus": "full logits\n+bonus",
              "trl_fused_entropy_bonus": "TRL 1.16 fused\n+bonus"}
    sides = list(results)
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(sides)), 4), dpi=110)
    vals = [results[s]["peak_extra_mib"] / 1024 for s in sides]
    colors = ["tab:blue" if s.startswith("rlcore") else "tab:gray" for s in sides]
    ax.bar([labels[s] for s in sides], vals, color=colors)
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.2f} GiB\n{results[sides[i]]['seconds']:.1f}s", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("peak extra memory (GiB)")
    ax.set_ylim(0, max(vals) * 1.25)
    summary = f"rlcore/TRL {ratio:.2f}"
    if "rlcore_entropy_bonus" in results:
        b = results["rlcore_entropy_bonus"]["peak_extra_mib"]
        summary = (f"bonus/default {b / results['rlcore_default']['peak_extra_mib']:.2f}, "
                   f"rlcore/TRL-fused with bonus {b / results['trl_fused_entropy_bonus']['peak_extra_mib']:.2f}")
    ax.set_title(f"logprobs+loss+backward, V={a.vocab}, {a.batch}×{a.tokens} tok\n{summary} ({a.dtype}, {a.device})")
    fig.tight_layout()
    fig.savefig(a.out + ".png")


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


if __name__ == "__main__":
    main()
