"""A data-parallel run computes what one process computes: the same script under ``torchrun
--nproc_per_node 2`` (TRL's multi-GPU recipe is ``accelerate launch``, which starts the same kind
of process group) ends with the weights and the logged numbers of one process running the whole
batch. The ranks hold different numbers of tokens, and ``scale_rewards="batch"`` needs the whole
batch's reward std, so a rank that normalised or scaled over its own share would differ."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rlcore.testing.runs import launch_ranks

SCRIPT = Path(__file__).with_name("dp_run.py")


def _run(out: Path, ranks: int, loss_type: str, scale_rewards: str) -> dict[str, Any]:
    launch_ranks(SCRIPT, ranks, out, 16 // ranks, loss_type, scale_rewards)
    logs = json.loads((out / "logs.json").read_text())
    assert logs["world_size"] == ranks
    return {"weights": torch.load(out / "weights.pt"), "logs": logs["logs"], "evals": logs["evals"],
            "completions": [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]}


@pytest.mark.parametrize("loss_type, scale_rewards", [("dapo", "batch")])
def test_two_ranks_train_and_log_like_one_process(tmp_path: Path, loss_type: str, scale_rewards: str) -> None:
    one = _run(tmp_path / "one", 1, loss_type, scale_rewards)
    two = _run(tmp_path / "two", 2, loss_type, scale_rewards)
    moved = max((one["weights"][n] - two["weights"][n]).abs().max().item() for n in one["weights"])
    assert moved < 1e-5, f"weights differ by {moved} between 2 ranks and 1 process"
    assert len(one["logs"]) == len(two["logs"]) == 2
    for a, b in zip(one["logs"], two["logs"]):
        for key in ("reward", "reward_std", "completion_length", "completions/mean_length", "sampled_tokens",
                    "num_tokens", "frac_reward_zero_std", "policy_loss", "entropy", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    # evaluation (one rank's share of the last eval chunk is empty: it still joins the gathers)
    assert len(one["evals"]) == len(two["evals"]) == 1
    for key in ("eval_reward", "eval_reward_std", "eval_completion_length", "eval_loss", "eval_entropy"):
        assert two["evals"][0][key] == pytest.approx(one["evals"][0][key], rel=1e-5, abs=1e-6), key
    # completions.jsonl (rank 0 writes it) holds the whole batch, with the advantages one process gave
    train_one = [r for r in one["completions"] if r["split"] == "train"]
    train_two = [r for r in two["completions"] if r["split"] == "train"]
    one["completions"], two["completions"] = train_one, train_two
    assert len(one["completions"]) == len(two["completions"]) == 2 * 16
    key = lambda r: (r["step"], str(r["prompt"]), str(r["completion"]))  # noqa: E731 - rank order differs
    for a, b in zip(sorted(one["completions"], key=key), sorted(two["completions"], key=key)):
        assert key(a) == key(b) and b["advantage"] == pytest.approx(a["advantage"], abs=1e-6)
