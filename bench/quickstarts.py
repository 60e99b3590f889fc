"""Do the README's multi-turn quickstarts show multi-turn RL working? Runs each one to completion,
exactly as a user types it, and checks what the README promises:

    rlcore openenv serve guess_number --port P &
    rlcore train --scheduler openenv_scheduler --env-url http://127.0.0.1:P --reward openenv_reward
    rlcore train --scheduler gym_scheduler --env frozen_lake --reward gym_reward --max_turns 6

(no model, no dataset: each scheduler's embedded default with the built-in tiny model), and the
OpenEnv example's tiny-model config (``rlcore train --config examples/openenv/tiny.yaml``). Per run:
wall time, the reward of the first and last 10% of steps and their ratio (or, if the first is not
positive, the improvement as a share of the per-step reward range), turns per episode, env steps,
what ended the episodes (env done / max_turns / length / failed), the share of turns that ended by
a stop string, the CPU seconds the run used (a loaded machine stretches wall time, not CPU time:
on N free cores a run takes at least cpu_s / N), and whether the issue's bar is met: ≥ 2 turns per
episode, no episode ended by length, last-10% reward ≥ 2× the first (or an improvement ≥ half the
range), under 180 s.

Each run is a subprocess pinned to ``--cpus`` cores (``os.sched_setaffinity``; 2 by default, the
machine the README talks about) so runs side by side (``--parallel``) do not share cores.
``--extra 'NAME:FLAGS'`` adds a run of quickstart NAME with extra flags (a hyper-parameter
sweep). Writes bench/results/quickstarts.json and .png (the reward curves, turns per episode
beneath). Run: ``python bench/quickstarts.py [--parallel]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
QUICKSTARTS = {
    "openenv": ["--scheduler", "openenv_scheduler", "--env-url", "{url}", "--reward", "openenv_reward"],
    "gym": ["--scheduler", "gym_scheduler", "--env", "frozen_lake", "--reward", "gym_reward", "--max_turns", "6"],
    "openenv-example": ["--config", str(Path(__file__).resolve().parents[1] / "examples" / "openenv" / "tiny.yaml"),
                        "--env-url", "{url}"],
}
BAR_SECONDS = 180.0


def summarize(steps: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """The figures the README quotes and the issue's pass/fail bar, from one run's metrics.jsonl."""
    rewards = [float(s["reward"]) for s in steps]
    k = max(1, len(rewards) // 10)
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    span = (max(rewards) - min(rewards)) if rewards else 0.0
    turns = [float(s["num_turns"]) for s in steps]
    ended = {key.split("/", 1)[1]: sum(float(s.get(key) or 0.0) for s in steps) / len(steps)
             for key in steps[-1] if key.startswith("episodes_ended/")}
    rises = last >= 2 * first if first > 0 else (last - first) >= 0.5 * span
    out = {
        "steps": len(steps),
        "wall_s": round(wall, 1),
        "reward_first_10pct": round(first, 4),
        "reward_last_10pct": round(last, 4),
        "reward_ratio": round(last / first, 2) if first > 0 else None,
        "reward_improvement_share_of_range": round((last - first) / span, 3) if span else 0.0,
        "turns_per_episode": round(sum(turns) / len(turns), 2),
        "turns_per_episode_first_last_10pct": [round(sum(turns[:k]) / k, 2), round(sum(turns[-k:]) / k, 2)],
        "env_steps": int(sum(float(s.get("env_steps") or 0) for s in steps)),
        "episodes_ended": {key: round(v, 3) for key, v in ended.items()},
        "turns_ended_by_stop": round(sum(float(s.get("turns_ended_by_stop") or 0) for s in steps) / len(steps), 3),
        "failed_trajectories": int(sum(float(s.get("failed_trajectories") or 0) for s in steps)),
    }
    out["bar"] = {
        "turns_per_episode_ge_2": out["turns_per_episode"] >= 2,
        "no_episode_ended_by_length": ended.get("length", 0.0) == 0.0,
        "reward_rises": bool(rises),
        "under_180s": wall < BAR_SECONDS,
    }
    out["passes"] = all(out["bar"].values())
    return out


def _pin(cpus: list[int] | None) -> Any:
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def start_run(name: str, quickstart: str, extra: list[str], url: str, workdir: Path, cpus: list[int] | None) -> dict[str, Any]:
    out = workdir / name
    argv = [a.replace("{url}", url) for a in QUICKSTARTS[quickstart]] + extra + ["--output_dir", str(out)]
    cmd = [sys.executable, "-m", "rlcore.commands.cli", "train", *argv]
    env = dict(os.environ, OMP_NUM_THREADS=str(len(cpus) if cpus else os.cpu_count() or 1))
    log = open(workdir / f"{name}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_pin(cpus))
    shown = "rlcore train " + " ".join(shlex.quote(a) for a in argv[:-2])
    return {"name": name, "quickstart": quickstart, "command": shown, "cpus": cpus, "proc": proc, "log": log,
            "out": out, "t0": time.perf_counter()}


def finish_run(run: dict[str, Any]) -> dict[str, Any]:
    _pid, status, usage = os.wait4(run["proc"].pid, 0)
    run["proc"].returncode = rc = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - run["t0"]
    run["log"].close()
    metrics = run["out"] / "metrics.jsonl"
    result: dict[str, Any] = {"name": run["name"], "quickstart": run["quickstart"], "command": run["command"],
                              "cpus": len(run["cpus"]) if run["cpus"] else os.cpu_count(), "returncode": rc}
    if rc != 0 or not metrics.exists():
        result["error"] = Path(run["log"].name).read_text()[-2000:]
        return result
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    result.update(summarize(steps, wall))
    # CPU time is what a shared, loaded machine cannot inflate: on N free cores wall >= cpu / N
    result["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 1)
    result["wall_s_if_alone_at_least"] = round(result["cpu_s"] / max(1, result["cpus"] or 1), 1)
    result["curve"] = {"reward": [s["reward"] for s in steps], "num_turns": [s["num_turns"] for s in steps]}
    return result


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [q for q in QUICKSTARTS if any(r["quickstart"] == q and "curve" in r for r in results)]
    fig, axes = plt.subplots(2, max(1, len(names)), figsize=(6 * max(1, len(names)), 6.5), squeeze=False,
                             sharex="col", gridspec_kw={"height_ratios": [3, 1]})
    for col, q in enumerate(names):
        top, bottom = axes[0][col], axes[1][col]
        for r in results:
            if r["quickstart"] != q or "curve" not in r:
                continue
            xs = range(1, len(r["curve"]["reward"]) + 1)
            ratio = f"{r['reward_ratio']}×" if r.get("reward_ratio") else f"+{r['reward_improvement_share_of_range']:.0%} of range"
            label = f"{r['name']}: {r['reward_first_10pct']:.2f} → {r['reward_last_10pct']:.2f} ({ratio}), {r['wall_s']:.0f}s"
            top.plot(xs, r["curve"]["reward"], label=label)
            bottom.plot(xs, r["curve"]["num_turns"], label=r["name"])
        top.set_title(f"{q} quickstart: mean reward per step")
        top.set_ylabel("reward")
        top.legend(fontsize=8)
        bottom.set_ylabel("turns / episode")
        bottom.set_xlabel("step")
        bottom.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=sorted(QUICKSTARTS), action="append", help="run only these quickstarts")
    p.add_argument("--extra", action="append", default=[], help="NAME:FLAGS — one more run of quickstart NAME with FLAGS")
    p.add_argument("--parallel", action="store_true", help="run side by side, each pinned to its own --cpus cores")
    p.add_argument("--cpus", type=int, default=2, help="cores per run (0: no pinning)")
    p.add_argument("--out", default=str(RESULTS / "quickstarts"), help="output path without suffix")
    a = p.parse_args()

    from rl_plugin_openenv.testing import ServerProcess
    from rlcore.testing import tiny_model_path

    tiny_model_path()  # build the model once, outside the timed runs
    plan = [(q, q, []) for q in (a.only or QUICKSTARTS)]
    for spec in a.extra:
        q, _, flags = spec.partition(":")
        if q not in QUICKSTARTS:
            p.error(f"--extra {spec!r}: NAME must be one of {', '.join(QUICKSTARTS)}")
        plan.append((f"{q}+{' '.join(shlex.split(flags))}", q, shlex.split(flags)))
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    results: list[dict[str, Any]] = []
    with ServerProcess(max_concurrent_envs=256) as server, tempfile.TemporaryDirectory() as tmp:
        slot = 0

        def cpus_for_next() -> list[int] | None:
            nonlocal slot
            if not a.cpus or len(available) < a.cpus:
                return None
            chunk = available[(slot * a.cpus) % len(available):][: a.cpus]
            slot += 1
            return chunk if len(chunk) == a.cpus else available[: a.cpus]

        if a.parallel:
            runs = [start_run(n, q, extra, server.url, Path(tmp), cpus_for_next()) for n, q, extra in plan]
            results = [finish_run(r) for r in runs]
        else:
            for n, q, extra in plan:
                results.append(finish_run(start_run(n, q, extra, server.url, Path(tmp), cpus_for_next())))
                slot = 0
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": {"cpus_per_run": a.cpus, "cpu_count": os.cpu_count(), "parallel": a.parallel},
              "bar": "turns/episode >= 2, no episode ended by length, last-10% reward >= 2x first "
                     "(or +half the range), under 180 s on the pinned cores",
              "runs": results}
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    plot(results, out.with_suffix(".png"))
    for r in results:
        brief = {k: r.get(k) for k in ("name", "passes", "wall_s", "cpu_s", "reward_first_10pct", "reward_last_10pct",
                                       "reward_ratio", "turns_per_episode", "episodes_ended", "turns_ended_by_stop", "error")}
        print(json.dumps(brief))


if __name__ == "__main__":
    main()
