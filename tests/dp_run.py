"""One GRPO run, written for ``tests/test_data_parallel.py``: the same script runs as one process
(``python tests/dp_run.py OUT BATCH``) and under ``torchrun --nproc_per_node 2`` (each rank takes
BATCH/2 rows per device), the way a TRL user launches a data-parallel run. A fifth argument
``padding_free`` turns ``padding_free`` on (``tests/test_padding_free.py``).

Completions are scripted from the prompt (``ScriptedSampler``), so both layouts roll out exactly the
same groups whatever rank draws them; their lengths differ from prompt to prompt, so the ranks hold
different numbers of active tokens — what makes the dapo normaliser's scope visible. Plain SGD keeps
the final weights proportional to the summed gradients (Adam's first step would hide their scale).
Rank 0 writes the final weights and the logged metrics to OUT.
"""

from __future__ import annotations

import json
import os
import sys
import zlib

import torch
from transformers import AutoTokenizer

from rlcore import GRPOConfig, GRPOTrainer
from rlcore.data.demo import tiny_model_path
from rlcore.data.tasks import digits_dataset, digits_reward
from rlcore.testing import ScriptedSampler


def main(out: str, per_device: int, loss_type: str, scale_rewards: str, padding_free: bool = False) -> None:
    model = tiny_model_path()
    tok = AutoTokenizer.from_pretrained(model)
    seen: dict[int, int] = {}

    def respond(prompt_ids: list[int], params: object, call_index: int) -> str:
        key = zlib.crc32(bytes(str(prompt_ids), "utf-8"))
        k = seen[key] = seen.get(key, -1) + 1  # the k-th sample of this prompt (the group's members)
        digits = "".join(str((key >> (2 * i)) % 10) for i in range(1 + (key + 3 * k) % 7))
        return digits if k % 3 else f"{digits} apples"  # some answer in digits only, some not

    args = GRPOConfig(
        output_dir=out, use_cpu=True, per_device_train_batch_size=per_device, num_generations=4,
        max_completion_length=12, max_steps=2, learning_rate=0.5, optim="sgd", lr_scheduler_type="constant",
        loss_type=loss_type, scale_rewards=scale_rewards, beta=0.0, logging_steps=1, save_strategy="no",
        report_to="none", seed=0, overwrite_output_dir=True, log_completions=True, num_completions_to_print=0,
        eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=per_device, padding_free=padding_free,
    )
    # 5 eval prompts in chunks of 4: with 2 ranks, one rank's share of the last chunk is empty
    evals = [{**row, "prompt": row["prompt"] + " (held out)"} for row in digits_dataset(5, seed=1)]
    trainer = GRPOTrainer(model, reward_funcs=digits_reward, args=args, train_dataset=digits_dataset(64), eval_dataset=evals,
                          processing_class=tok, sampler=ScriptedSampler(respond=respond, tokenizer=tok))
    trainer.train()
    if trainer.args.process_index == 0:
        weights = {n: p.detach().cpu() for n, p in trainer.accelerator.unwrap_model(trainer.model).named_parameters()}
        torch.save(weights, os.path.join(out, "weights.pt"))
        logs = [h for h in trainer.state.log_history if "reward" in h]
        evals = [h for h in trainer.state.log_history if "eval_reward" in h]
        with open(os.path.join(out, "logs.json"), "w") as f:
            json.dump({"world_size": int(trainer.args.world_size), "logs": logs, "evals": evals}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], padding_free=sys.argv[5:6] == ["padding_free"])
