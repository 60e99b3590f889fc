"""A ``difficulty`` prompt-sampler run for ``tests/test_prompt_sampler.py``: the same script runs as
one process and under ``torchrun --nproc_per_node 2``; every rank writes the rows its sampler drew
(before the rank takes its share) and the sampler's history to OUT/rank-R.json."""

from __future__ import annotations

import json
import os
import sys

from rlcore import GRPOConfig, GRPOTrainer
from rlcore.data.demo import tiny_model_path
from rlcore.testing.spread import by_row


def main(out: str, per_device: int) -> None:
    rows = [{"prompt": f"easy {i}", "easy": True} for i in range(4)] + [{"prompt": f"hard {i}", "easy": False} for i in range(4)]
    args = GRPOConfig(output_dir=out, use_cpu=True, per_device_train_batch_size=per_device, num_generations=2,
                      max_completion_length=2, max_steps=4, learning_rate=1e-3, save_strategy="no", report_to="none",
                      seed=1, prompt_sampler="difficulty", prompt_sampler_options={"window": 1}, disable_tqdm=True)
    trainer = GRPOTrainer(tiny_model_path(), reward_funcs=[by_row], args=args, train_dataset=rows)
    drawn: list[list[int]] = []
    take = trainer.prompt_sampler.take

    def recording(k: int) -> list[int]:
        idx = take(k)
        drawn.append(idx)
        return idx

    trainer.prompt_sampler.take = recording
    trainer.train()
    with open(os.path.join(out, f"rank-{trainer.args.process_index}.json"), "w") as f:
        json.dump({"world_size": int(trainer.args.world_size), "drawn": drawn,
                   "state": trainer.prompt_sampler.state_dict()}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
