"""One TRL 1.16 GRPO snippet on the real model (SmolLM2-135M-Instruct, CPU), run twice: with
``from trl import GRPOConfig, GRPOTrainer`` and with ``from rlcore import …``. The reward function
must see the same inputs (the same prompts, conversational completions that are the decoded
completion ids, the same keyword arguments, the dataset's columns) and both runs must log the same
metric keys. (tests/test_trl_compat.py runs many snippets on the tiny model; this one meets a real
tokenizer and chat template — SmolLM2's injects a system prompt — and real ``<|im_end|>`` endings.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import rlcore  # noqa: E402

EOS = 2  # <|im_end|>


class Recorder:
    """A TRL-style reward (``**kwargs``) that keeps everything it was given."""

    def __init__(self) -> None:
        self.__name__ = "recorder"
        self.calls: list[dict[str, Any]] = []

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        self.calls.append({"prompts": prompts, "completions": completions, "keys": sorted(kwargs),
                           "completion_ids": [list(ids) for ids in kwargs["completion_ids"]],
                           "answer": list(kwargs["answer"]), "step": kwargs["trainer_state"].global_step})
        scores = [float(len(c[0]["content"]) % 5) for c in completions]
        self.calls[-1]["scores"] = scores
        return scores


def snippet(lib: Any, model: str, output_dir: str, rows: list[dict[str, Any]]) -> tuple[Recorder, list[dict[str, Any]]]:
    """TRL's quickstart shape; ``lib`` is the module the one import line names."""
    recorder = Recorder()
    args = lib.GRPOConfig(
        output_dir=output_dir, per_device_train_batch_size=4, num_generations=2, max_completion_length=16,
        max_steps=1, logging_steps=1, learning_rate=1e-6, shuffle_dataset=False, seed=0, report_to="none",
        use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, gradient_checkpointing=False,
    )
    trainer = lib.GRPOTrainer(model=model, reward_funcs=recorder, args=args,
                              train_dataset=datasets.Dataset.from_list(rows))
    trainer.train()
    return recorder, [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]


@pytest.fixture(scope="module")
def rows(shared_data: Path) -> list[dict[str, Any]]:
    """Four real GSM8K rows (the shortest questions), conversational, with their answers."""
    with (shared_data / "gsm8k" / "train.jsonl").open(encoding="utf-8") as f:
        gsm8k = sorted((json.loads(line) for line in f if line.strip()), key=lambda r: len(r["question"]))
    # "Reply in one word" ends in <|im_end|> within the cap on this model: real early endings
    return [{"prompt": [{"role": "user", "content": r["question"] + (" Reply in one word." if i % 2 else "")}],
             "answer": r["answer"]} for i, r in enumerate(gsm8k[:4])]


def test_a_trl_snippet_on_the_real_model_gives_the_same_reward_inputs_and_metric_keys(
    smollm2_dir: str, smollm2_tokenizer: Any, rows: list[dict[str, Any]], tmp_path: Path
) -> None:
    runs = {name: snippet(lib, smollm2_dir, str(tmp_path / name), rows) for name, lib in (("trl", trl), ("rlcore", rlcore))}
    (theirs, trl_logs), (ours, our_logs) = runs["trl"], runs["rlcore"]
    assert len(theirs.calls) == len(ours.calls) == len(trl_logs) == len(our_logs) == 1
    for t, r in zip(theirs.calls, ours.calls):
        assert r["keys"] == t["keys"]  # the same keyword arguments, no more, no fewer
        assert r["prompts"] == t["prompts"]  # the dataset's messages, in order, each num_generations times
        assert r["answer"] == t["answer"] and r["step"] == t["step"]
        for call in (t, r):
            for completion, ids in zip(call["completions"], call["completion_ids"]):
                assert [m["role"] for m in completion] == ["assistant"]
                # the text a reward reads is the decoded ids (special tokens skipped), on both trainers
                assert completion[0]["content"] == smollm2_tokenizer.decode(ids, skip_special_tokens=True)
                assert 0 < len(ids) <= 16 and (len(ids) == 16 or ids[-1] == EOS)  # an early end keeps its <|im_end|>
                assert EOS not in ids[:-1]
    # the real model ends some replies early on both: the <|im_end|> handling above was exercised
    for call_list in (theirs.calls, ours.calls):
        assert any(ids[-1] == EOS for c in call_list for ids in c["completion_ids"])
    # the metrics mean on rlcore what they mean on TRL, here with real early endings: lengths count
    # the <|im_end|>, "clipped" is "no <|im_end|>", num_tokens counts prompt and completion tokens,
    # reward stds are the batch's (unbiased), frac_reward_zero_std the share of groups without spread
    for calls, logs in ((theirs.calls, trl_logs), (ours.calls, our_logs)):
        (call,), (h,) = calls, logs
        lengths = [len(ids) for ids in call["completion_ids"]]
        ended = [len(ids) for ids in call["completion_ids"] if ids[-1] == EOS]
        prompt_tokens = sum(len(smollm2_tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True)["input_ids"])
                            for p in call["prompts"])
        want = {"completions/mean_length": sum(lengths) / len(lengths), "completions/min_length": min(lengths),
                "completions/max_length": max(lengths), "completions/clipped_ratio": 1 - len(ended) / len(lengths),
                "completions/mean_terminated_length": sum(ended) / len(ended), "completions/min_terminated_length": min(ended),
                "completions/max_terminated_length": max(ended), "num_tokens": prompt_tokens + sum(lengths)}
        scores = torch.tensor(call["scores"])
        groups = scores.view(-1, 2)  # num_generations consecutive samples per prompt
        want.update({"reward": scores.mean().item(), "reward_std": scores.std().item(),
                     "rewards/recorder/mean": scores.mean().item(), "rewards/recorder/std": scores.std().item(),
                     "frac_reward_zero_std": (groups[:, 0] == groups[:, 1]).float().mean().item()})
        assert {k: h[k] for k in want} == pytest.approx(want), ({k: h[k] for k in want}, want)
    trl_keys = set().union(*(h.keys() for h in trl_logs))
    our_keys = set().union(*(h.keys() for h in our_logs))
    assert trl_keys - our_keys == set(), sorted(trl_keys - our_keys)
    for h in our_logs:
        assert h["num_tokens"] > 0 and 0 < h["completions/mean_length"] <= 16
        assert h["invariant_violations"] == 0
