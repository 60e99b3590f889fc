"""A dynamic-sampling run for ``tests/test_dynamic_sampling.py``: the same script runs as one process
and under ``torchrun --nproc_per_node 2``; every rank writes, per step, the rows of the groups the
run kept (every rank's, in order), the rows of its own share, and the rounds, to OUT/rank-R.json."""

from __future__ import annotations

import json
import os
import sys

from rlcore import GRPOConfig, GRPOTrainer
from rlcore.data.demo import tiny_model_path
from rlcore.testing.spread import by_row


def main(out: str, per_device: int) -> None:
    rows = [{"prompt": f"easy {i}", "easy": True, "idx": i} for i in range(6)] + \
        [{"prompt": f"hard {i}", "easy": False, "idx": 6 + i} for i in range(6)]
    args = GRPOConfig(output_dir=out, use_cpu=True, per_device_train_batch_size=per_device, num_generations=2,
                      max_completion_length=2, max_steps=3, learning_rate=1e-3, save_strategy="no", report_to="none",
                      seed=1, dynamic_sampling=True, max_resample_rounds=4, disable_tqdm=True, plots=False)
    trainer = GRPOTrainer(tiny_model_path(), reward_funcs=[by_row], args=args, train_dataset=rows)
    kept: list[list[int]] = []
    mine: list[list[int]] = []
    rounds: list[int] = []
    generate = trainer._generate_and_score

    def recording() -> object:
        micro = generate()
        whole = trainer.whole_batch
        firsts = lambda trajs: [t.data["idx"] for k, t in enumerate(trajs) if k == 0 or trajs[k - 1].group_id != t.group_id]
        kept.append(firsts(whole.trajectories))
        mine.append(firsts(whole.trajectories[whole.start:whole.stop]))
        rounds.append(int(trainer._gen_metrics["dynamic_sampling/rounds"]))
        return micro

    trainer._generate_and_score = recording
    trainer.train()
    with open(os.path.join(out, f"rank-{trainer.args.process_index}.json"), "w") as f:
        json.dump({"world_size": int(trainer.args.world_size), "kept": [sorted(k) for k in kept], "mine": mine,
                   "rounds": rounds}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
