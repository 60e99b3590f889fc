"""Does openenv_scheduler overlap slow environment steps? 64 trajectories x 4 turns against a real
OpenEnv server (rl-plugin-openenv's guess_number in a subprocess) whose every step takes 100 ms.

Reported (one run, side by side, because these machines are noisy):

* ``ideal``  = turns x (time to generate one turn for all 64 as one batch + 100 ms step);
* ``async``  = ``run_rollouts`` wall time with ``openenv_scheduler`` (one session per trajectory,
  64 in flight), and ``async / ideal``;
* ``serial`` = one trajectory at a time (what a loop over episodes does), measured on a few
  trajectories and scaled to 64: the "64 x" a blocking client would cost;
* client counters (sessions opened/closed, capacity retries, timeouts).

Sampler: ``hf`` on the offline tiny model with every turn exactly ``--tokens`` tokens
(min_tokens = max_tokens), or ``--sampler scripted`` (a fixed ``--gen-delay`` per call).
Writes bench/results/openenv_overlap.json and .png. Run: ``python bench/openenv_overlap.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RLCORE_PLUGINS", "rl-plugin-openenv")

from rlcore.rollout import encode_prompt, run_rollouts  # noqa: E402
from rlcore.types import Prompt, SamplingParams  # noqa: E402

from rl_plugin_openenv.scheduler import OpenEnvScheduler  # noqa: E402
from rl_plugin_openenv.testing import ServerProcess  # noqa: E402

RESULTS = Path(__file__).parent / "results"
FIRST_OBS = "I am thinking of a number between 1 and 100. You have 8 guesses. Reply with JSON like {\"guess\": 50}."


class FixedTurns(OpenEnvScheduler):
    """Exactly ``max_turns`` turns: fixed-length replies end with "length", the episode goes on."""

    def check_finished(self, infer_request: Any, response_choice: Any, current_turn: int) -> bool:
        return current_turn >= self.max_turns


def make_sampler(kind: str, tokens: int, gen_delay: float) -> Any:
    from rlcore.testing import ScriptedSampler, build_tokenizer, tiny_model_path

    if kind == "scripted":
        return ScriptedSampler(['{"guess": 1}'], build_tokenizer(), delay=gen_delay)
    import rlcore

    return rlcore.get("sampler", "hf")(model=tiny_model_path(), seed=0)


async def batch_time(sampler: Any, n: int, params: SamplingParams, repeats: int = 3) -> float:
    """Time to generate one turn for ``n`` trajectories at once (the sampler batches them)."""
    ids = encode_prompt(sampler.tokenizer, [{"role": "user", "content": FIRST_OBS}])
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        await asyncio.gather(*(sampler.generate(list(ids), params) for _ in range(n)))
        best = min(best, time.perf_counter() - t0)
    return best


async def rollout(sampler: Any, url: str, n: int, turns: int, params: SamplingParams, concurrency: int) -> tuple[float, Any]:
    sched = FixedTurns(sampler, env_url=url, max_turns=turns, stop_on_truncation=False)
    prompts = [Prompt([], [], data={"env_config": {"target": 100, "max_attempts": turns + 2}}) for _ in range(n)]
    t0 = time.perf_counter()
    res = await run_rollouts(sched, prompts, sampling_params=params, concurrency=concurrency, progress=True)
    wall = time.perf_counter() - t0
    assert res.stats["failed"] == 0, res.stats["failure_reasons"]
    assert all(t.num_turns == turns for t in res.trajectories)
    return wall, sched.metrics()


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    sampler = make_sampler(a.sampler, a.tokens, a.gen_delay)
    params = SamplingParams(max_tokens=a.tokens, min_tokens=a.tokens, temperature=1.0)
    with ServerProcess(step_delay=a.step_delay, max_concurrent_envs=a.trajectories) as server:
        await rollout(sampler, server.url, 4, 1, params, a.trajectories)  # warm-up: sessions, kernels
        gen = await batch_time(sampler, a.trajectories, params)
        ideal = a.turns * (gen + a.step_delay)
        wall, counters = await rollout(sampler, server.url, a.trajectories, a.turns, params, a.trajectories)
        serial_wall, _ = await rollout(sampler, server.url, a.serial_sample, a.turns, params, 1)
    serial_64 = serial_wall / a.serial_sample * a.trajectories
    await sampler.close()
    return {
        "trajectories": a.trajectories, "turns": a.turns, "step_delay_s": a.step_delay, "sampler": a.sampler,
        "tokens_per_turn": a.tokens, "one_turn_batch_generation_s": gen,
        "ideal_s": ideal, "async_s": wall, "async_over_ideal": wall / ideal,
        "serial_estimate_s": serial_64, "serial_measured_on": a.serial_sample,
        "serial_over_async": serial_64 / wall,
        "naive_64x_s": a.trajectories * ideal, "counters": counters,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["ideal\nturns×(gen+step)", "openenv_scheduler\n(async, 64 sessions)", f"serial\n(×{result['trajectories']} est.)"]
    values = [result["ideal_s"], result["async_s"], result["serial_estimate_s"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar(names, values, color=["#999999", "#2b7bba", "#d9534f"])
    for b, v in zip(bars, values):
        ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.1f}s", ha="center", va="bottom")
    ax.set_ylabel("wall time (s)")
    ax.set_title(f"{result['trajectories']} trajectories × {result['turns']} turns, "
                 f"OpenEnv step {result['step_delay_s'] * 1000:.0f} ms: async/ideal = {result['async_over_ideal']:.2f}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trajectories", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--step-delay", type=float, default=0.1)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--sampler", choices=("hf", "scripted"), default="hf")
    p.add_argument("--gen-delay", type=float, default=0.05, help="scripted sampler: seconds per generate call")
    p.add_argument("--serial-sample", type=int, default=4, help="trajectories run one at a time for the serial estimate")
    p.add_argument("--out", default=str(RESULTS / "openenv_overlap"))
    a = p.parse_args()
    result = asyncio.run(main_async(a))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in result.items() if k != "counters"}, indent=2))


if __name__ == "__main__":
    main()
