"""TRL drop-in: snippets written the way TRL 1.16's GRPO docs write them run on TRL's trainer and on
rlcore's with only the import changed, and must agree: the same reward arguments (recorded),
the same metric keys, the same number of completions per step (same seed).

Each snippet is a function of ``lib`` (the ``trl`` module or ``rlcore``) — the one import line a
user changes. TRL runs the real ``trl.GRPOTrainer`` on the same tiny model, on the CPU.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import pytest

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import rlcore  # noqa: E402

LIBS = {"trl": trl, "rlcore": rlcore}

#: settings every snippet shares (tiny model, CPU, quiet); the snippets add their own
COMMON = dict(
    per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=2, logging_steps=1,
    report_to="none", use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, seed=0,
    gradient_checkpointing=False,
)


def standard_rows(n: int = 8) -> Any:
    return datasets.Dataset.from_list([{"prompt": f"What is {i} + 1?", "solution": str(i + 1)} for i in range(n)])


def conversational_rows(n: int = 8) -> Any:
    return datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "solution": str(i + 1)} for i in range(n)]
    )


class Recorder:
    """A TRL-style reward (``**kwargs``) that records what it was given, per call."""

    def __init__(self, name: str = "recorder") -> None:
        self.__name__ = name
        self.calls: list[dict[str, Any]] = []

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        self.calls.append({
            "keys": sorted(["prompts", "completions", *kwargs]),
            "n": len(completions),
            "prompt_type": _shape(prompts[0]),
            "completion_type": _shape(completions[0]),
            "completion_ids_type": type(kwargs["completion_ids"][0]).__name__,
            "solution": list(kwargs.get("solution", [])),
            "trainer_state_step": kwargs["trainer_state"].global_step,
        })
        kwargs["log_metric"]("recorder/calls", float(len(self.calls)))
        kwargs["log_extra"]("recorder_len", [len(str(c)) for c in completions])
        return [float(len(str(c)) % 3) for c in completions]


def _shape(x: Any) -> str:
    if isinstance(x, str):
        return "str"
    if isinstance(x, list) and x and isinstance(x[0], dict):
        return "messages[" + ",".join(sorted(x[0])) + "]"
    return type(x).__name__


def run(lib: Any, tmp: str, reward_funcs: Any, train_dataset: Any, **over: Any) -> tuple[Any, list[dict[str, Any]]]:
    """``GRPOTrainer(model, reward_funcs=…, args=GRPOConfig(…), train_dataset=…).train()`` as in TRL's docs."""
    from rlcore.testing import tiny_model_path

    values = dict(COMMON, output_dir=tmp)
    values.update(over)
    args = lib.GRPOConfig(**values)
    trainer = lib.GRPOTrainer(model=tiny_model_path(), reward_funcs=reward_funcs, args=args, train_dataset=train_dataset)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
    return trainer, logs


def both(tmp_path: Any, make: Callable[[], tuple[Any, Any]], **over: Any) -> dict[str, tuple[Any, Any, list[dict[str, Any]]]]:
    """Run one snippet on both trainers; ``make()`` returns fresh (reward_funcs, dataset)."""
    out = {}
    for name, lib in LIBS.items():
        rewards, data = make()
        trainer, logs = run(lib, str(tmp_path / name), rewards, data, **over)
        out[name] = (trainer, rewards, logs)
    return out


# --- 1. reward arguments: TRL's names, TRL's shapes, both dataset formats ---------------------------
@pytest.mark.parametrize("rows,prompt_type,completion_type", [
    (standard_rows, "str", "str"),
    (conversational_rows, "messages[content,role]", "messages[content,role]"),
])
def test_reward_functions_receive_what_trl_passes(tmp_path: Any, rows: Any, prompt_type: str, completion_type: str) -> None:
    res = both(tmp_path, lambda: (Recorder(), rows()))
    calls = {name: r[1].calls for name, r in res.items()}
    assert calls["trl"] and len(calls["trl"]) == len(calls["rlcore"])
    for t, r in zip(calls["trl"], calls["rlcore"]):
        assert r["keys"] == t["keys"]  # exactly TRL's argument names, no more
        assert (r["prompt_type"], r["completion_type"]) == (t["prompt_type"], t["completion_type"]) == (prompt_type, completion_type)
        assert r["completion_ids_type"] == t["completion_ids_type"] == "list"
        assert r["n"] == t["n"]
        assert r["trainer_state_step"] == t["trainer_state_step"]
    # log_metric lands in the step's logs on both
    for name in LIBS:
        assert all("recorder/calls" in h for h in res[name][2]), name


def test_trl_quickstart_rewards_run_on_conversational_data(tmp_path: Any) -> None:
    """TRL 1.16's own reward helpers (conversational completions) score on rlcore as on TRL."""
    from trl.rewards import think_format_reward

    def accuracy_reward(completions: list[Any], solution: list[str], **kwargs: Any) -> list[float]:
        return [float(s in c[0]["content"]) for c, s in zip(completions, solution)]

    res = both(tmp_path, lambda: ([accuracy_reward, think_format_reward], conversational_rows()))
    for name in LIBS:
        logs = res[name][2]
        assert len(logs) == 2
        for h in logs:
            assert h["rewards/think_format_reward/mean"] == 0.0  # scored (random text has no <think>), not NaN
            assert h["rewards/accuracy_reward/mean"] is not None


def test_a_reward_that_always_raises_stops_rlcore_as_it_stops_trl(tmp_path: Any) -> None:
    def format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
        return [float(c[0]["content"].startswith("<think>")) for c in completions]  # conversational code

    with pytest.raises(TypeError):  # TRL: the reward's own exception ends the run
        run(trl, str(tmp_path / "trl"), format_reward, standard_rows())
    with pytest.raises(rlcore.RewardFunctionError, match="format_reward") as info:
        run(rlcore, str(tmp_path / "rlcore"), format_reward, standard_rows())
    assert isinstance(info.value.__cause__, TypeError)


def test_plain_text_prompts_are_not_chat_templated(tmp_path: Any) -> None:
    from transformers import AutoTokenizer

    from rlcore.testing import tiny_model_path

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    seen: list[list[int]] = []

    def capture(completions: list[Any], trajectories: list[Any], **kwargs: Any) -> list[float]:
        seen.extend(t.prompt_ids for t in trajectories)
        return [0.0] * len(completions)

    run(rlcore, str(tmp_path), capture, standard_rows(4), max_steps=1)
    texts = {tok.decode(ids) for ids in seen}
    assert texts <= {f"What is {i} + 1?" for i in range(4)}  # raw text, as TRL tokenizes it
    assert not any("<|im_start|>" in t for t in texts)
