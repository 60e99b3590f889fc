"""The trainer's scoring is a value (issue #30): ``GRPOTrainer._score`` returns a ScoredBatch holding
one batch's numbers and leaves nothing on the trainer for a later call to read back; TRL's agent
schedulers are reached by their registered names."""

from __future__ import annotations

from typing import Any

import rlcore
from rlcore.data.tasks import digits_dataset
from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer
from rlcore.trainer.scored import Rollout, ScoredBatch


def test_trl_agent_schedulers_are_registered_by_name() -> None:
    from rlcore.compat.trl.agents import EnvironmentToolScheduler, RolloutFuncScheduler, TRLToolScheduler

    assert rlcore.get("scheduler", "trl_tools") is TRLToolScheduler
    assert rlcore.get("scheduler", "trl_environment") is EnvironmentToolScheduler
    assert rlcore.get("scheduler", "trl_rollout_func") is RolloutFuncScheduler


def test_score_returns_the_batch_and_sets_nothing_on_the_trainer(tmp_path: Any, tiny_model_dir: str) -> None:
    args = GRPOConfig(output_dir=str(tmp_path), reward_funcs=["digits"], num_generations=2, per_device_train_batch_size=4,
                      max_completion_length=3, max_steps=1, save_strategy="no", seed=0, disable_tqdm=True,
                      report_to="none", plots=False)
    trainer = GRPOTrainer(tiny_model_dir, args=args, train_dataset=digits_dataset(8))
    first = trainer.rollout(trainer._next_prompts())
    assert isinstance(first, Rollout) and len(first) == 4
    assert first.invariant_violations == trainer._invariant_failures == 0
    before = set(vars(trainer))
    a = trainer._score(first)
    assert set(vars(trainer)) == before and trainer.whole_batch is None  # no state left for a later read
    assert isinstance(a, ScoredBatch)
    assert a.trajectories == list(first) and a.whole.trajectories == list(first)  # one process: the whole batch
    assert len(a.advantages) == len(a.whole_advantages) == 4 and a.advantages == a.whole_advantages
    assert a.reward_errors == {"reward_errors/digits": 0.0}
    assert a.columns["digits"] == [t.rewards["digits"] for t in first]
    kept = (list(a.advantages), dict(a.reward_errors), list(a.whole.trajectories))
    b = trainer._score(trainer.rollout(trainer._next_prompts()))
    assert b is not a and (list(a.advantages), dict(a.reward_errors), list(a.whole.trajectories)) == kept
    assert not {id(t) for t in b.whole.trajectories} & {id(t) for t in a.whole.trajectories}
