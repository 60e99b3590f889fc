"""TRL 1.16's entropy bonus (``entropy_coef``, ``use_adaptive_entropy`` and its knobs) on rlcore,
held to TRL's own numbers: the real ``trl.GRPOTrainer`` and rlcore's run the same tiny config on the
same tokens and must log the same ``loss``, ``entropy``, ``entropy_coef``, ``policy_loss`` and
``grad_norm`` at every step.

Both trainers get their completions from one deterministic TRL-style ``rollout_func`` (so sampling
cannot differ) and start from the same tiny model with the same seed, optimizer and lr schedule. The
mutations at the end (wrong sign, wrong normaliser, the coefficient moved at the wrong boundary)
are applied to rlcore and must break the agreement — the comparison can fail.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import warnings
from typing import Any, Iterator

import pytest

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import rlcore  # noqa: E402
from rlcore.testing import tiny_model_path  # noqa: E402

KEYS = ("loss", "entropy", "entropy_coef", "policy_loss", "grad_norm")


class FixedRollout:
    """A TRL ``rollout_func`` whose completions depend only on how often it was called: random
    tokens (no special ones) of 2-8 tokens each, or with ``same`` one 6-token completion repeated
    across the batch (zero advantages: the entropy bonus is then the only gradient, so the order in
    which each trainer cuts a generation batch into micro-batches cannot matter)."""

    def __init__(self, same: bool = False) -> None:
        self.__name__ = "fixed_rollout"
        self.calls = 0
        self.same = same

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        tok = trainer.processing_class
        g = random.Random(1000 + self.calls)
        self.calls += 1
        shared = [g.randrange(11, 1024) for _ in range(6)]
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for p in prompts:
            comp = list(shared) if self.same else [g.randrange(11, 1024) for _ in range(g.randrange(2, 9))]
            out["prompt_ids"].append(tok.encode(p))
            out["completion_ids"].append(comp)
            out["logprobs"].append([0.0] * len(comp))
        return out


def token_sum_reward(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    return [float(sum(c) % 5) for c in completion_ids]


#: the configs run on both trainers (name -> GRPOConfig overrides; "same" picks the rollout)
CASES: dict[str, dict[str, Any]] = {
    # static bonus, per-sequence (grpo) policy normalisation: the bonus must stay a token mean
    "static_grpo": dict(entropy_coef=0.5, loss_type="grpo"),
    # static bonus on the high-entropy half of the tokens (TRL's effective mask)
    "static_dapo_top_entropy": dict(entropy_coef=0.3, loss_type="dapo", top_entropy_quantile=0.5),
    # adaptive around a target the entropy crosses: both branches, the gate on and off
    "adaptive_crossing": dict(use_adaptive_entropy=True, entropy_coef=0.1, entropy_coef_delta=0.05,
                              entropy_target=6.9, loss_type="grpo", max_steps=4),
    # adaptive, rising to its cap, with a dapo policy term
    "adaptive_capped": dict(use_adaptive_entropy=True, entropy_coef=0.1, entropy_coef_delta=0.05, entropy_coef_max=0.2,
                            entropy_target=7.0, loss_type="dapo"),
    # adaptive over accumulation windows: one generation feeds 4 optimizer steps of 2 micro-steps
    "adaptive_accumulated": dict(use_adaptive_entropy=True, entropy_coef=0.1, entropy_coef_delta=0.05, entropy_target=7.0,
                                 gradient_accumulation_steps=2, steps_per_generation=4, num_iterations=2, max_steps=5,
                                 same=True),
}


def run(lib: Any, out: str, **over: Any) -> list[dict[str, Any]]:
    values: dict[str, Any] = dict(
        per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=3, logging_steps=1,
        report_to="none", use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, seed=0,
        gradient_checkpointing=False, learning_rate=0.05, output_dir=out,
    )
    same = over.pop("same", False)
    values.update(over)
    rows = datasets.Dataset.from_list([{"prompt": "Count:"} for _ in range(64)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = lib.GRPOTrainer(model=tiny_model_path(), reward_funcs=token_sum_reward, args=lib.GRPOConfig(**values),
                                  train_dataset=rows, rollout_func=FixedRollout(same))
        trainer.train()
    return [{k: h.get(k) for k in KEYS} for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]


@pytest.fixture(scope="module")
def trl_logs(tmp_path_factory: Any) -> dict[str, list[dict[str, Any]]]:
    return {name: run(trl, str(tmp_path_factory.mktemp(f"trl-{name}")), **dict(over)) for name, over in CASES.items()}


def mismatches(theirs: list[dict[str, Any]], ours: list[dict[str, Any]]) -> list[str]:
    """Every (step, key) where the two trainers disagree beyond float noise."""
    bad = [f"{len(theirs)} TRL steps vs {len(ours)}"] if len(theirs) != len(ours) else []
    for step, (t, r) in enumerate(zip(theirs, ours), 1):
        for k in KEYS:
            if t[k] is None or r[k] is None:
                if t[k] is not r[k]:
                    bad.append(f"step {step} {k}: TRL {t[k]} rlcore {r[k]}")
            elif not math.isclose(t[k], r[k], rel_tol=2e-4, abs_tol=2e-5):
                bad.append(f"step {step} {k}: TRL {t[k]} rlcore {r[k]}")
    return bad


@pytest.mark.parametrize("case", list(CASES))
def test_rlcore_entropy_bonus_matches_trl(case: str, trl_logs: dict[str, list[dict[str, Any]]], tmp_path: Any) -> None:
    theirs = trl_logs[case]
    ours = run(rlcore, str(tmp_path), **dict(CASES[case]))
    assert len(theirs) == CASES[case].get("max_steps", 3)
    assert all(h["entropy_coef"] is not None for h in theirs)  # TRL logs it every step with the bonus on
    assert mismatches(theirs, ours) == []
    coefs = [h["entropy_coef"] for h in ours]
    if case == "adaptive_crossing":  # the test exercises both directions of the controller
        seq = [CASES[case]["entropy_coef"], *coefs]
        assert any(b > a for a, b in zip(seq, seq[1:])) and any(b < a for a, b in zip(seq, seq[1:])), seq
    if case == "adaptive_capped":
        assert coefs[-1] == pytest.approx(0.2) and coefs[0] == pytest.approx(0.15)
    if case == "adaptive_accumulated":  # one step of delta per optimizer step, not per micro-step
        assert coefs == pytest.approx([0.15, 0.2, 0.25, 0.3, 0.35])
    if case.startswith("static"):
        assert any(abs(h["loss"] - h["policy_loss"]) > 1e-3 for h in ours)  # the bonus is in the loss


# --- mutations: each must break the agreement --------------------------------------------------------
@contextlib.contextmanager
def wrong_sign(mp: pytest.MonkeyPatch) -> Iterator[None]:
    from rlcore.algorithms.entropy import EntropyBonus

    real = EntropyBonus.applied_coef
    mp.setattr(EntropyBonus, "applied_coef", property(lambda self: -real.fget(self)))
    yield


@contextlib.contextmanager
def per_sequence_normaliser(mp: pytest.MonkeyPatch) -> Iterator[None]:
    """The bonus normalised like grpo's policy term (mean per sequence, then over sequences)."""
    import rlcore.loop.loss as loss_mod

    def per_seq(entropy: Any, mask: Any) -> Any:
        m = mask.to(entropy.dtype)
        rows = m.sum(-1) > 0
        h = ((entropy * m).sum(-1) / m.sum(-1).clamp(min=1.0))[rows].mean()
        return h, (entropy * m).sum(), m.sum()

    mp.setattr(loss_mod, "entropy_bonus_term", per_seq)
    yield


@contextlib.contextmanager
def every_micro_step(mp: pytest.MonkeyPatch) -> Iterator[None]:
    """The adaptive coefficient moved after every micro-batch instead of every optimizer step."""
    from rlcore.trainer.grpo import GRPOTrainer

    def boundary(self: Any) -> None:
        if self.entropy_bonus is not None and self.model.training:
            self.entropy_bonus.step()
            self._train_metrics.add({"entropy_coef": self.entropy_bonus.coef})

    mp.setattr(GRPOTrainer, "_entropy_boundary", boundary)
    yield


@contextlib.contextmanager
def per_generation(mp: pytest.MonkeyPatch) -> Iterator[None]:
    """The adaptive coefficient moved once per generation batch (when the buffer runs dry)."""
    from rlcore.trainer.grpo import GRPOTrainer

    def boundary(self: Any) -> None:
        if self.entropy_bonus is not None and self.model.training and not self._buffer:
            self.entropy_bonus.step()
        if self.entropy_bonus is not None and self.model.training and self.accelerator.sync_gradients:
            self._train_metrics.add({"entropy_coef": self.entropy_bonus.coef})

    mp.setattr(GRPOTrainer, "_entropy_boundary", boundary)
    yield


@contextlib.contextmanager
def no_gate(mp: pytest.MonkeyPatch) -> Iterator[None]:
    """Adaptive control applying its coefficient whatever the entropy."""
    from rlcore.algorithms.entropy import EntropyBonus

    mp.setattr(EntropyBonus, "applied_coef", property(lambda self: self.coef))
    yield


@contextlib.contextmanager
def detached_entropy(mp: pytest.MonkeyPatch) -> Iterator[None]:
    """The bonus added without the entropy's gradient (the value right, the update wrong)."""
    import rlcore.loop.loss as loss_mod

    real = loss_mod.entropy_bonus_term
    mp.setattr(loss_mod, "entropy_bonus_term", lambda e, m: tuple(x.detach() for x in real(e, m)))
    yield


MUTATIONS = [
    ("static_grpo", wrong_sign), ("static_grpo", per_sequence_normaliser), ("static_grpo", detached_entropy),
    ("adaptive_accumulated", every_micro_step), ("adaptive_accumulated", per_generation),
    ("adaptive_crossing", no_gate),
]


@pytest.mark.parametrize("case,mutation", MUTATIONS, ids=[f"{c}-{m.__name__}" for c, m in MUTATIONS])
def test_a_mutated_entropy_bonus_disagrees_with_trl(case: str, mutation: Any, trl_logs: dict[str, Any],
                                                      tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with mutation(monkeypatch):
        ours = run(rlcore, str(tmp_path), **dict(CASES[case]))
    assert mismatches(trl_logs[case], ours) != []


# --- checkpoints: the adaptive state survives a resume exactly --------------------------------------
def _rlcore_args(out: str, **over: Any) -> Any:
    values: dict[str, Any] = dict(
        output_dir=out, per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=4,
        logging_steps=1, report_to="none", use_cpu=True, save_strategy="steps", save_steps=2, disable_tqdm=True, seed=0,
        learning_rate=0.05, use_adaptive_entropy=True, entropy_coef=0.1, entropy_coef_delta=0.05, entropy_target=6.9,
        gradient_accumulation_steps=2, plots=False,
    )
    values.update(over)
    return rlcore.GRPOConfig(**values)


def _train(out: str, **over: Any) -> Any:
    rows = [{"prompt": "Count:"} for _ in range(64)]
    return rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=token_sum_reward, args=_rlcore_args(out, **over),
                              train_dataset=rows, rollout_func=FixedRollout())


def test_adaptive_entropy_state_is_checkpointed_and_resumed_exactly(tmp_path: Any) -> None:
    from rlcore.training.metrics import read_jsonl

    whole = str(tmp_path / "whole")
    a = _train(whole)
    a.train()
    state = json.load(open(os.path.join(whole, "checkpoint-2", "rlcore_state.json")))
    ctrl = state["entropy_control"]
    logged = read_jsonl(whole)
    assert ctrl["entropy_coef"] == pytest.approx(logged[1]["entropy_coef"])
    assert ctrl["last_world_entropy"] is not None and math.isfinite(ctrl["last_world_entropy"])

    # a second trainer resumed from checkpoint-2 continues the controller where it stood: same coef,
    # same gate, so steps 3-4 log exactly what the uninterrupted run logged
    parts = str(tmp_path / "parts")
    os.makedirs(parts)
    import shutil

    shutil.copytree(os.path.join(whole, "checkpoint-2"), os.path.join(parts, "checkpoint-2"))
    shutil.copy(os.path.join(whole, "rlcore_run.json"), os.path.join(parts, "rlcore_run.json"))
    with open(os.path.join(parts, "metrics.jsonl"), "w") as f:
        for rec in logged[:2]:
            f.write(json.dumps(rec) + "\n")
    b = rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=token_sum_reward, args=_rlcore_args(parts),
                           train_dataset=[{"prompt": "Count:"} for _ in range(64)], rollout_func=_skip(FixedRollout(), 2))
    b.train(resume_from_checkpoint=os.path.join(parts, "checkpoint-2"))
    assert b.entropy_bonus.coef == a.entropy_bonus.coef
    assert b.entropy_bonus.last_entropy == a.entropy_bonus.last_entropy
    keys = ("step", "loss", "entropy", "entropy_coef", "grad_norm")
    assert [{k: r.get(k) for k in keys} for r in read_jsonl(parts)] == [{k: r.get(k) for k in keys} for r in logged]


def test_resume_without_the_saved_controller_would_differ(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: drop the controller state from the checkpoint and the resumed run
    starts its gate and coefficient afresh, logging something else."""
    import rlcore.training.checkpoint as ckpt

    real = ckpt.write_state
    monkeypatch.setattr(ckpt, "write_state", lambda path, state, buffer=None: real(path, {**state, "entropy_control": None}, buffer))
    whole = str(tmp_path / "whole")
    a = _train(whole)
    a.train()
    b = rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=token_sum_reward, args=_rlcore_args(whole, max_steps=4),
                           train_dataset=[{"prompt": "Count:"} for _ in range(64)], rollout_func=_skip(FixedRollout(), 2))
    b.train(resume_from_checkpoint=os.path.join(whole, "checkpoint-2"))
    assert b.entropy_bonus.coef != a.entropy_bonus.coef or b.entropy_bonus.last_entropy != a.entropy_bonus.last_entropy


def _skip(rollout: FixedRollout, calls: int) -> FixedRollout:
    """The rollout as it stands after ``calls`` generations (a resumed run continues its data)."""
    rollout.calls = calls
    return rollout


# --- config: bad values are one line naming the field ---------------------------------------------
@pytest.mark.parametrize("over,field", [
    (dict(entropy_coef=-0.1), "entropy_coef"),
    (dict(entropy_coef=float("nan")), "entropy_coef"),
    (dict(entropy_coef_min=0.5, entropy_coef_max=0.1), "entropy_coef_min"),
    (dict(entropy_coef_delta=-0.01), "entropy_coef_delta"),
    (dict(entropy_target=-1.0), "entropy_target"),
    (dict(entropy_target=float("inf")), "entropy_target"),
    (dict(entropy_coef_max=-1.0, entropy_coef_min=-2.0), "entropy_coef_min"),
    (dict(use_adaptive_entropy=True, entropy_coef=2.0), "entropy_coef"),
])
def test_bad_entropy_settings_are_one_line_naming_the_field(over: dict[str, Any], field: str, tmp_path: Any) -> None:
    with pytest.raises(rlcore.ConfigError, match=f"^{field}") as info:
        rlcore.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, **over)
    assert "\n" not in str(info.value)


def test_evaluation_applies_the_bonus_but_never_moves_the_controller(tmp_path: Any) -> None:
    """TRL gates the controller on train mode: an eval forward adds ``-coef·H`` to its loss but
    neither fills the window nor moves the coefficient."""
    import torch

    trainer = _train(str(tmp_path), max_steps=1)
    bonus = trainer.entropy_bonus
    bonus.last_entropy = 0.0  # a measurement at or below the target: the gate is open
    mb = trainer._generate_and_score()[0]
    trainer.model.eval()
    with torch.no_grad():
        loss = float(trainer.compute_loss(trainer.model, mb))
    metrics = trainer._train_metrics.pop()
    assert bonus.window is None and bonus.coef == 0.1 and bonus.last_entropy == 0.0
    assert "entropy_coef" not in metrics  # logged at train optimizer steps only, as in TRL
    assert loss == pytest.approx(metrics["policy_loss"] - 0.1 * metrics["entropy"], abs=1e-5)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # what Trainer.train sets for a micro-step
    trainer.compute_loss(trainer.model, mb)  # outside accumulation every micro-step is a boundary
    assert bonus.last_entropy > 0.0 and bonus.coef != 0.1  # a training micro-batch moves it


def test_cli_and_yaml_take_the_entropy_fields(tmp_path: Any) -> None:
    from rlcore.commands.train import build_plan

    plan = build_plan(["--use-adaptive-entropy", "true", "--entropy_coef", "0.01", "--entropy-target", "3.5",
                       "--entropy_coef_max", "0.05", "--output-dir", str(tmp_path / "a")])
    a = plan.args
    assert (a.use_adaptive_entropy, a.entropy_coef, a.entropy_target, a.entropy_coef_max) == (True, 0.01, 3.5, 0.05)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"entropy_coef: 0.02\noutput_dir: {tmp_path / 'b'}\n")
    assert build_plan(["--config", str(cfg)]).args.entropy_coef == 0.02
    with pytest.raises(rlcore.ConfigError, match="^entropy_coef must be a finite number >= 0") as info:
        build_plan(["--entropy_coef", "-0.5", "--output-dir", str(tmp_path / "c")])
    assert "\n" not in str(info.value)
