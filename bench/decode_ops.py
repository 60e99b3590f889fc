"""Operations one static-path decode step launches: the model's own forward, the fused forward with
each projection apart, and the fused forward with q/k/v and gate/up packed (its default).

Inside a CUDA graph a small model's decode step costs what its kernels cost (see
``decode_profile.py``), so the number of device operations per step is the figure the fused forward
(:mod:`rlcore.sampling.hf.fused`) exists to cut. This counts them on any device — the CPU included,
so it runs where no GPU is — by recording every aten operation the step dispatches (one step of
``StaticEngine._step``: sampling the next tokens, then the forward), leaving out views and casts to
the dtype a tensor already has (no kernel). ``F.rms_norm`` counts as one operation: it is one fused
kernel on CUDA (torch >= 2.9), while the CPU runs it as six.

    python bench/decode_ops.py                                  # qwen2-0.5b shape, bf16, 8 rows
    python bench/decode_ops.py --shape tiny --dtype float32
    python bench/decode_ops.py --lora 16 --out bench/results/decode_ops_lora   # PEFT LoRA on every projection

Writes ``bench/results/decode_ops.json`` and ``.png`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
from shapes import load_model, shape_names  # noqa: E402

from rlcore.sampling.hf import fused as hf_fused, static as hf_static  # noqa: E402
from rlcore.sampling.hf.sampler import HFSampler  # noqa: E402
from rlcore.types import SamplingParams  # noqa: E402

RESULTS = Path(__file__).parent / "results"
#: aten operations that only make a new view of the same memory (no kernel on any device)
VIEWS = {"view", "_unsafe_view", "reshape", "expand", "unsqueeze", "squeeze", "transpose", "permute", "slice",
         "select", "t", "alias", "as_strided", "detach", "_reshape_alias", "split", "unbind", "lift_fresh",
         "split_with_sizes", "numpy_T"}


class OpCounter(TorchDispatchMode):
    """Counts the aten operations dispatched while active, by name (views and no-op casts left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.quiet = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if self.quiet or name in VIEWS:
            return out
        if name in ("to", "_to_copy") and isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor) \
                and out.data_ptr() == args[0].data_ptr():
            return out
        self.counts[name] += 1
        return out


def count_step(model: Any, tok: Any, rows: int, fused: bool, pack: bool | None = None) -> collections.Counter[str]:
    """The operations of one decode step over ``rows`` rows (the first step the engine runs)."""
    counted: dict[str, collections.Counter[str]] = {}
    real_step, real_norm = hf_static.StaticEngine._step, F.rms_norm
    counter: OpCounter | None = None

    def one_norm(*args: Any, **kwargs: Any) -> torch.Tensor:
        if counter is None:
            return real_norm(*args, **kwargs)
        counter.counts["rms_norm"] += 1
        counter.quiet += 1
        try:
            return real_norm(*args, **kwargs)
        finally:
            counter.quiet -= 1

    def step(engine: Any, b: int, cols: int, flags: Any) -> None:
        nonlocal counter
        if counted:
            return real_step(engine, b, cols, flags)
        counter = OpCounter()
        with counter:
            real_step(engine, b, cols, flags)
        counted["step"], counter = counter.counts, None

    hf_static.StaticEngine._step = step
    hf_fused.F = _Functional(one_norm)
    try:
        sampler = HFSampler(model, tok, decode="static", fused_decode=fused, pack_projections=pack, max_batch_size=rows,
                            batch_window_ms=50)
        prompt = tok.encode("what is 12 + 7? think step by step", add_special_tokens=False)

        async def run() -> None:
            await asyncio.gather(*(sampler.generate(prompt, SamplingParams(max_tokens=2, seed=i)) for i in range(rows)))
            await sampler.close()

        asyncio.run(run())
    finally:
        hf_static.StaticEngine._step = real_step
        hf_fused.F = F
    return counted["step"]


class _Functional:
    """``torch.nn.functional`` with ``rms_norm`` replaced (the fused module looks it up at call time)."""

    def __init__(self, rms_norm: Any) -> None:
        self.rms_norm = rms_norm

    def __getattr__(self, name: str) -> Any:
        return getattr(F, name)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ("model", "fused_unpacked", "fused") if n in result]
    fig, ax = plt.subplots(figsize=(7, 4))
    kinds: list[str] = []
    for n in names:  # each side's six largest kinds
        kinds += [k for k in list(result[n]["ops"])[:6] if k not in kinds]
    colors = plt.get_cmap("tab20").colors
    bottom = [0] * len(names)
    for i, kind in enumerate([*kinds, "other"]):
        vals = [(result[n]["ops"].get(kind, 0) if kind != "other" else
                 sum(v for k, v in result[n]["ops"].items() if k not in kinds)) for n in names]
        ax.bar(names, vals, bottom=bottom, label=kind, color=colors[i % len(colors)])
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, n in enumerate(names):
        ax.text(i, bottom[i], f"{result[n]['total']} ({result[n]['per_layer']:.1f}/layer)", ha="center", va="bottom")
    ax.set_ylabel("device operations per decode step")
    lora = f", LoRA r={result['lora_rank']}" if result.get("lora_rank") else ""
    ax.set_title(f"{result['shape']} {result['dtype']}{lora}, {result['rows']} rows: one static-path step")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen2-0.5b", choices=shape_names())
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--lora", type=int, default=0, metavar="R",
                    help="wrap the model in PEFT LoRA adapters of rank R on all seven projections (a colocated LoRA run)")
    ap.add_argument("--out", default=str(RESULTS / "decode_ops"))
    a = ap.parse_args()
    model, tok = load_model(a.shape, a.device, a.dtype)
    layers = model.config.num_hidden_layers
    if a.lora:
        import peft

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = peft.get_peft_model(model, peft.LoraConfig(r=a.lora, target_modules=targets)).eval()
    result: dict[str, Any] = {"shape": a.shape, "dtype": a.dtype, "device": a.device, "rows": a.rows, "layers": layers,
                              "lora_rank": a.lora, "torch": torch.__version__}
    # fused: as the sampler runs it by default (projections packed where they can be, see
    # hf_fused.pack_budget); fused_unpacked: each projection its own matmul (a model too big to pack)
    for name, fused, pack in (("model", False, None), ("fused_unpacked", True, False), ("fused", True, None)):
        ops = count_step(model, tok, a.rows, fused, pack)
        total = sum(ops.values())
        result[name] = {"total": total, "per_layer": total / layers, "ops": dict(ops.most_common())}
        print(f"{name:>6}: {total:5d} operations per step ({total / layers:.1f} per layer)")
    result["ratio"] = result["model"]["total"] / result["fused"]["total"]
    print(f"the fused step launches {result['ratio']:.2f}x fewer operations "
          f"({result['model']['total'] / result['fused_unpacked']['total']:.2f}x unpacked)")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
