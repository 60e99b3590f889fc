"""rl-plugin-agents' ``agent_proxy``: what the endpoint costs per request, and a run that learns.

``overhead`` — the time per request of an agent going through the proxy against calling the
sampler directly, side by side in one process, alternating (these machines are noisy: ratios hold,
seconds do not). Both sides sample the same work: ``--inflight`` agents at once, each making
``--requests`` requests of the same prompt, every reply exactly ``--tokens`` tokens (min_tokens =
max_tokens), on the ``hf`` sampler:

* ``direct`` — each agent awaits ``sampler.generate(prompt_ids, params)`` ``--requests`` times;
* ``proxy``  — ``run_rollouts`` with ``agent_proxy``: each agent is an ``openai.AsyncOpenAI`` client
  posting ``/v1/chat/completions`` to the run's endpoint (HTTP on 127.0.0.1, the server thread,
  the session's rendering and bookkeeping, the driver and its invariant checks included); every
  request after an agent's first sends a fresh conversation, so each is a sample of its own
  whose prompt is the same tokens the direct side samples from.

Reported per in-flight level: the median wall time of each side over ``--repeats`` alternating
runs, per request, and ``proxy / direct - 1`` (the overhead; the issue's bar is ≤ 10 % at 64 in
flight). ``--model`` picks the model (default: the built-in tiny model; ``smollm2``: the real
SmolLM2-135M-Instruct, whose generation is what a real run's requests cost).
Writes ``bench/results/agent_proxy_overhead[_NAME].json`` / ``.png``.

``learning`` — ``rlcore train --scheduler agent_proxy --agent …`` as a user types it (a subprocess),
on the calculator task with an agent that must call the calculator tool
(:mod:`rl_plugin_agents.examples.calculator`); the reward curve from its ``metrics.jsonl``, the
first and last 10 % of steps, the share of episodes that called the tool, wall time.
Why a warm start (``--model warm``, the default): neither the built-in tiny model (random weights)
nor SmolLM2-135M-Instruct writes a parsable tool call on this task (SmolLM2: 0 of 32 episodes, with
the format in the system message and with a one-shot example before the question, when the task
was chosen), and RL cannot reinforce what is never sampled. So the tiny model first gets
``--warm-steps`` supervised steps on the episode's format (:func:`warm_start`: half the
demonstrations call the calculator, half answer with a wrong number) and RL has to learn that
calling pays. Writes ``bench/results/agent_proxy_learning.json`` / ``.png``.

    python bench/agent_proxy.py overhead [--inflight 1 8 64] [--requests 2] [--tokens 16] [--model smollm2]
    python bench/agent_proxy.py learning [--steps 30] [--model smollm2]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("RLCORE_PLUGINS", "rl-plugin-agents")

RESULTS = Path(__file__).parent / "results"
QUESTION = [{"role": "user", "content": "What is 37 * 91? Reply with the number."}]


def model_path(name: str) -> str:
    if name == "tiny":
        from rlcore.data.demo import tiny_model_path

        return tiny_model_path()
    if name == "smollm2":
        from rlcore.testing.smollm2 import smollm2_path

        return str(smollm2_path())
    return name


def meta(model: str) -> dict[str, Any]:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "model": model, "load_average": list(os.getloadavg())}


# --- overhead ------------------------------------------------------------------------------------------
async def _direct(sampler: Any, ids: list[int], params: Any, inflight: int, requests: int) -> float:
    async def agent() -> None:
        for _ in range(requests):
            await sampler.generate(list(ids), params)

    t0 = time.perf_counter()
    await asyncio.gather(*(agent() for _ in range(inflight)))
    return time.perf_counter() - t0


def _proxy_agent(requests: int) -> Any:
    async def agent(client: Any, row: dict[str, Any]) -> float:
        for _ in range(requests):
            await client.chat.completions.create(model="policy", messages=QUESTION)
        return 0.0

    return agent


async def _proxy(scheduler: Any, prompt: Any, inflight: int) -> tuple[float, dict[str, Any]]:
    from rlcore.rollout.driver import run_rollouts

    t0 = time.perf_counter()
    result = await run_rollouts(scheduler, [prompt], num_generations=inflight, concurrency=inflight, progress=False)
    wall = time.perf_counter() - t0
    return wall, result.stats


def overhead(args: argparse.Namespace) -> dict[str, Any]:
    from rlcore.chat_template import encode_prompt
    from rlcore.sampling.hf.sampler import HFSampler
    from rlcore.types import Prompt, SamplingParams

    from rl_plugin_agents.scheduler import AgentProxyScheduler

    path = model_path(args.model)
    sampler = HFSampler(path, batch_window_ms=args.batch_window_ms, seed=0)
    tok = sampler.tokenizer
    ids = encode_prompt(tok, QUESTION)
    params = SamplingParams(max_tokens=args.tokens, min_tokens=args.tokens, temperature=1.0)
    prompt = Prompt(messages=list(QUESTION), prompt_ids=list(ids), data={})
    out: dict[str, Any] = {"meta": meta(args.model), "setup": {k: v for k, v in vars(args).items() if k != "func"},
                           "levels": {}}
    loop = asyncio.new_event_loop()
    try:
        for inflight in args.inflight:
            sched = AgentProxyScheduler(sampler, agent=_proxy_agent(args.requests), tokenizer=tok, sampling_params=params,
                                        max_requests=args.requests)
            # warm-up: the model's first batches, the server, the client's connection pool
            loop.run_until_complete(_direct(sampler, ids, params, inflight, 1))
            loop.run_until_complete(_proxy(sched, prompt, inflight))
            gc.collect()
            gc.freeze()
            direct, proxy, stats = [], [], None
            for r in range(args.repeats):
                order = ("direct", "proxy") if r % 2 == 0 else ("proxy", "direct")
                for side in order:
                    if side == "direct":
                        direct.append(loop.run_until_complete(_direct(sampler, ids, params, inflight, args.requests)))
                    else:
                        wall, stats = loop.run_until_complete(_proxy(sched, prompt, inflight))
                        proxy.append(wall)
            gc.unfreeze()
            loop.run_until_complete(sched.close())
            n = inflight * args.requests
            d, p = statistics.median(direct), statistics.median(proxy)
            level = {"requests": n, "direct_s": direct, "proxy_s": proxy, "direct_median_s": d, "proxy_median_s": p,
                     "direct_per_request_ms": 1000 * d / n, "proxy_per_request_ms": 1000 * p / n,
                     "added_per_request_ms": 1000 * (p - d) / n, "overhead": p / d - 1.0,
                     "failed": stats["failed"] if stats else None}
            out["levels"][str(inflight)] = level
            print(f"{inflight:>3} in flight: direct {level['direct_per_request_ms']:.1f} ms/request, proxy "
                  f"{level['proxy_per_request_ms']:.1f} ms/request, overhead {100 * level['overhead']:+.1f}% "
                  f"(failed {level['failed']})", flush=True)
    finally:
        loop.run_until_complete(sampler.close())
        loop.close()
    top = out["levels"].get("64")
    if top is not None:
        out["bar"] = {"overhead_at_64": top["overhead"], "met": top["overhead"] <= 0.10}
    out["meta"]["load_average_end"] = list(os.getloadavg())
    return out


def plot_overhead(out: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted(out["levels"], key=int)
    d = [out["levels"][k]["direct_per_request_ms"] for k in levels]
    p = [out["levels"][k]["proxy_per_request_ms"] for k in levels]
    fig, ax = plt.subplots(figsize=(6, 4))
    x = range(len(levels))
    ax.bar([i - 0.2 for i in x], d, 0.4, label="sampler directly")
    ax.bar([i + 0.2 for i in x], p, 0.4, label="through agent_proxy")
    for i, k in enumerate(levels):
        ax.annotate(f"{100 * out['levels'][k]['overhead']:+.0f}%", (i + 0.2, p[i]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), [f"{k} in flight" for k in levels])
    ax.set_ylabel("wall ms per request")
    ax.set_title(f"agent_proxy overhead ({out['meta']['model']}, {out['setup']['tokens']} tokens/reply)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


# --- learning -------------------------------------------------------------------------------------------
#: the RL run's hyper-parameters on the warm-started tiny model (the embedded tiny-model recipe's,
#: which apply only when no --model is given, with a lower learning rate for a model that already
#: writes the call format)
WARM_RL = ["--learning-rate", "1e-3", "--lr-scheduler-type", "constant", "--warmup-steps", "0", "--loss-type", "dapo",
           "--beta", "0", "--temperature", "1.0", "--num-generations", "8", "--per-device-train-batch-size", "16",
           "--max-completion-length", "40", "--logging-steps", "1", "--save-strategy", "no", "--seed", "0"]


def warm_start(out_dir: Path, steps: int, seed: int = 1) -> dict[str, Any]:
    """The built-in tiny model (random weights) taught the *format* of the calculator episode by a
    few supervised steps: on the example agent's own prompts (its system message, the tool schema
    the template renders), half the demonstrations call the calculator with the question's
    expression and then state the tool's result, half answer at once with a wrong number. RL through
    the proxy then has to learn that calling the tool pays. Questions come from another seed than
    the task's rows. Returns what was done."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcore import chat_template as tk
    from rlcore.data.demo import tiny_model_path

    from rl_plugin_agents.examples.calculator import SYSTEM, TOOLS

    src = tiny_model_path()
    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src)
    rng = random.Random(seed)
    examples = []
    for i in range(256):
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        ask = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {a} * {b}?"}]
        if i % 2 == 0:
            call = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{a} * {b}"}}}}\n</tool_call>'
            examples.append((tk.render(tok, ask, add_generation_prompt=True, tools=TOOLS), call))
            after = ask + [{"role": "assistant", "content": call}, {"role": "tool", "content": str(a * b)}]
            examples.append((tk.render(tok, after, add_generation_prompt=True, tools=TOOLS), f"{a * b}"))
        else:
            examples.append((tk.render(tok, ask, add_generation_prompt=True, tools=TOOLS), f"{rng.randint(100, 9999)}"))
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rows = []
    for prompt, answer in examples:
        p, a = tk.encode_text(tok, prompt), tk.encode_text(tok, answer) + [end]
        rows.append((p + a, [-100] * len(p) + a))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    losses = []
    t0 = time.perf_counter()
    for step in range(steps):
        batch = [rows[rng.randrange(len(rows))] for _ in range(16)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([x + [tok.pad_token_id or 0] * (width - len(x)) for x, _ in batch])
        labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in batch])
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in batch])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return {"from": "rlcore's built-in tiny model (random weights)", "demonstrations": len(examples), "steps": steps,
            "batch": 16, "lr": 3e-3, "loss_first": losses[0], "loss_last": losses[-1], "seconds": round(time.perf_counter() - t0, 1)}


def learning(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="agent-proxy-learning-"))
    run_dir = work / "run"
    cmd = [sys.executable, "-m", "rlcore.commands.cli", "train", "--scheduler", "agent_proxy",
           "--agent", args.agent, "--max-steps", str(args.steps), "--output-dir", str(run_dir), "--plots", "false"]
    warm = None
    if args.model == "warm":
        warm = warm_start(work / "warm", args.warm_steps)
        print("warm start:", warm, flush=True)
        cmd += ["--model", str(work / "warm"), *WARM_RL]
    elif args.model != "tiny":
        cmd += ["--model", model_path(args.model)]
    cmd += args.extra
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    cpu0 = os.times()
    proc = subprocess.run(cmd, cwd=str(work), capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    cpu1 = os.times()
    if proc.returncode != 0:
        raise SystemExit(f"rlcore train exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rewards = [float(s["reward"]) for s in steps]
    k = max(1, len(rewards) // 10)
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    out = {
        "meta": meta(args.model), "command": cmd[2:], "steps": len(steps), "wall_s": round(wall, 1),
        "cpu_s": round((cpu1.children_user + cpu1.children_system) - (cpu0.children_user + cpu0.children_system), 1),
        "curves": {"reward": rewards, "num_turns": [float(s.get("num_turns", 0)) for s in steps],
                   "samples": [float(s.get("samples", 0)) for s in steps],
                   "failed": [float(s.get("failed_trajectories", 0)) for s in steps]},
        "first_10pct_reward": first, "last_10pct_reward": last,
        "invariant_violations": sum(float(s.get("invariant_violations", 0)) for s in steps),
        "warm_start": warm,
    }
    out["meta"]["load_average_end"] = list(os.getloadavg())
    print(f"{len(steps)} steps in {wall:.0f} s: reward {first:.3f} -> {last:.3f}", flush=True)
    return out


def plot_learning(out: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = out["curves"]["reward"]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(6, 5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot(range(1, len(r) + 1), r, marker=".", label="mean reward per step")
    w = max(1, len(r) // 10)
    smooth = [sum(r[max(0, i - w + 1):i + 1]) / len(r[max(0, i - w + 1):i + 1]) for i in range(len(r))]
    ax.plot(range(1, len(r) + 1), smooth, label=f"running mean ({w})")
    ax.set_ylabel("reward")
    ax.set_title(f"rlcore train --scheduler agent_proxy ({out['meta']['model']}, {out['wall_s']:.0f} s)")
    ax.legend()
    ax2.plot(range(1, len(r) + 1), out["curves"]["num_turns"], color="gray")
    ax2.set_ylabel("requests/episode")
    ax2.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--inflight", type=int, nargs="+", default=[1, 8, 64])
    o.add_argument("--requests", type=int, default=2)
    o.add_argument("--tokens", type=int, default=16)
    o.add_argument("--repeats", type=int, default=3)
    o.add_argument("--batch-window-ms", type=float, default=5.0)
    o.add_argument("--model", default="tiny")
    o.add_argument("--name", default="")
    o.set_defaults(func=overhead)
    le = sub.add_parser("learning")
    le.add_argument("--steps", type=int, default=30)
    le.add_argument("--agent", default="rl_plugin_agents.examples.calculator:run")
    le.add_argument("--model", default="warm", help="warm (the tiny model after --warm-steps supervised steps on the "
                    "episode's format), tiny, smollm2 or a path")
    le.add_argument("--warm-steps", type=int, default=150)
    le.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more rlcore train flags")
    le.add_argument("--name", default="")
    le.set_defaults(func=learning)
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    out = args.func(args)
    stem = f"agent_proxy_{args.cmd}" + (f"_{args.name}" if args.name else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(out, indent=1))
    (plot_overhead if args.cmd == "overhead" else plot_learning)(out, RESULTS / f"{stem}.png")
    print("wrote", RESULTS / f"{stem}.json")


if __name__ == "__main__":
    main()
