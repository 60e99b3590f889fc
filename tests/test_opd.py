"""On-policy distillation (issue 31, item 6): ``loss_type="opd"`` and ``opd_coef`` beside any RL loss,
a ``teacher_model`` scoring the student's own samples (TRL 1.16's IW-OPD estimator with gamma 0).

The student is the tiny model; its teacher a second tiny model with the same tokenizer and other
weights (a different seed, a wider initialisation: a sharper distribution, so there is a KL to close).
The real-model tests distil SmolLM2 into itself: the reverse KL and the gradient are exactly 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from rlcore.algorithms.losses import LossConfig, opd_loss
from rlcore.errors import ConfigError
from rlcore.loop.loss import batch_logprobs, batch_loss
from rlcore.plugins import get as get_component
from rlcore.types import Batch


def _teacher_dir(student_dir: str, out: Path, seed: int = 1, init_range: float = 0.3, vocab: int | None = None) -> str:
    """A tiny model with the student's tokenizer and its own random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(student_dir)
    config.initializer_range = init_range
    if vocab is not None:
        config.vocab_size = vocab
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(student_dir).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def teacher_dir(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return _teacher_dir(tiny_model_dir, tmp_path_factory.mktemp("teacher"))


def _rows(n: int = 8) -> list[dict[str, Any]]:
    return [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(n)]


def _length(completions: list[str]) -> list[float]:
    return [float(len(c)) for c in completions]


def _args(out: Path, **kw: Any) -> Any:
    from rlcore.training.config import GRPOConfig

    base = dict(output_dir=str(out), max_steps=2, per_device_train_batch_size=8, num_generations=4,
                max_completion_length=8, learning_rate=1e-3, seed=0, report_to=[], save_strategy="no",
                plots=False, use_cpu=True, disable_tqdm=True, logging_steps=1)
    base.update(kw)
    return GRPOConfig(**base)


def _fixed_batch(tokenizer: Any) -> Batch:
    ids = [tokenizer.encode(t) for t in ("What is 1 + 1? 2", "What is 3 + 3? the answer is 6")]
    T = max(map(len, ids))
    input_ids = torch.full((2, T), tokenizer.pad_token_id or 0, dtype=torch.long)
    attn = torch.zeros((2, T), dtype=torch.long)
    cmask = torch.zeros((2, T))
    for i, row in enumerate(ids):
        input_ids[i, :len(row)] = torch.tensor(row)
        attn[i, :len(row)] = 1
        cmask[i, 5:len(row)] = 1.0  # the "completion": every token after the first five
    return Batch(input_ids, attn, cmask, torch.zeros((2, T)), torch.zeros((2, T)), torch.ones(2, dtype=torch.bool))


def _exact_reverse_kl(student: Any, teacher: Any, batch: Batch) -> float:
    """Σ_v p_s(v) (log p_s(v) - log p_t(v)), averaged over the batch's positions: the whole distribution's KL."""
    with torch.no_grad():
        s = torch.log_softmax(student(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float(), -1)
        t = torch.log_softmax(teacher(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float(), -1)
    kl = (s.exp() * (s - t)).sum(-1)
    m = batch.attention_mask.float()
    return float((kl * m).sum() / m.sum())


def test_the_opd_loss_is_the_hand_computed_estimator_and_its_gradient() -> None:
    """loss = -Σ log p_s · (log p_t - log p_s).detach() / active tokens; opd/reverse_kl = mean(log p_s - log p_t)."""
    logps = torch.tensor([[0.0, -1.0, -2.0, -0.5], [0.0, -0.3, -4.0, -1.5]], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([[0.0, -0.5, -3.0, -9.0], [0.0, -0.3, -1.0, -2.5]], dtype=torch.float64)
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    loss, metrics = get_component("loss", "opd")(logps, None, torch.zeros(2), mask, config=LossConfig(), teacher_logps=teacher)
    # active tokens: (-1, -0.5), (-2, -3), (-0.3, -0.3), (-4, -1), (-1.5, -2.5)
    pairs = [(-1.0, -0.5), (-2.0, -3.0), (-0.3, -0.3), (-4.0, -1.0), (-1.5, -2.5)]
    expected = sum(-s * (t - s) for s, t in pairs) / 5
    assert abs(float(loss.detach()) - expected) < 1e-6
    assert abs(metrics["opd/reverse_kl"] - sum(s - t for s, t in pairs) / 5) < 1e-6
    loss.backward()
    want = torch.zeros_like(logps)
    for (i, j), (s, t) in zip([(0, 1), (0, 2), (1, 1), (1, 2), (1, 3)], pairs):
        want[i, j] = -(t - s) / 5  # the gradient of the reverse KL: (log p_s - log p_t) ∇ log p_s
    assert torch.allclose(logps.grad, want, atol=1e-12)


def test_opd_on_a_fixed_batch_of_the_tiny_model_matches_its_value_by_hand(tiny_model_dir: str, teacher_dir: str,
                                                                       tiny_tokenizer: Any) -> None:
    from transformers import AutoModelForCausalLM

    # float64 throughout: the loss (about -24 here) is held to 1e-6, finer than float32 resolves it
    student = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float64)
    batch = _fixed_batch(tiny_tokenizer)
    batch.teacher_logps = batch_logprobs(teacher, batch)
    loss, metrics = batch_loss(student, batch, opd_loss, LossConfig())
    # by hand: the logprob of each next token under each model, through log_softmax of the logits
    with torch.no_grad():
        s = torch.log_softmax(student(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.double(), -1)
        t = torch.log_softmax(teacher(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.double(), -1)
    total, rkl, n = 0.0, 0.0, 0
    for i in range(2):
        for pos in range(1, batch.input_ids.shape[1]):
            if batch.completion_mask[i, pos] == 0:
                continue
            tok = int(batch.input_ids[i, pos])
            ls, lt = float(s[i, pos - 1, tok]), float(t[i, pos - 1, tok])
            total += -ls * (lt - ls)
            rkl += ls - lt
            n += 1
    assert n > 4
    assert abs(float(loss) - total / n) < 1e-6
    assert abs(metrics["opd/reverse_kl"] - rkl / n) < 1e-6
    # beside an RL loss: dapo (advantages 0 here: its value is 0) + opd_coef x the same term
    both, m2 = batch_loss(student, batch, get_component("loss", "dapo"), LossConfig(opd_coef=0.5, num_items=float(n)))
    assert abs(float(both) - 0.5 * total / n) < 1e-6 and abs(m2["opd/reverse_kl"] - rkl / n) < 1e-6


def test_opd_alone_brings_the_student_closer_to_the_teacher(tiny_model_dir: str, teacher_dir: str, tiny_tokenizer: Any,
                                                           tmp_path: Path) -> None:
    """Ten steps of loss_type=opd on one prompt (64 samples of its first token a step): the exact reverse
    KL of the whole next-token distribution after the prompt, student to teacher, falls step by step."""
    from transformers import AutoModelForCausalLM

    from rlcore import GRPOTrainer

    prompt = "What is 0 + 0?"
    ids = torch.tensor([tiny_tokenizer.encode(prompt)])

    def exact_kl(student: Any, teacher: Any) -> float:
        with torch.no_grad():
            s = torch.log_softmax(student(ids.to(student.device)).logits[0, -1].float(), -1)
            t = torch.log_softmax(teacher(ids.to(teacher.device)).logits[0, -1].float(), -1)
        return float((s.exp() * (s - t)).sum())

    args = _args(tmp_path / "run", loss_type="opd", teacher_model=teacher_dir, max_steps=10, num_generations=64,
                 per_device_train_batch_size=64, max_completion_length=1, learning_rate=2e-3, lr_scheduler_type="constant")
    trainer = GRPOTrainer(tiny_model_dir, reward_funcs=[_length], args=args, train_dataset=[{"prompt": prompt}])
    seen: list[float] = []
    compute_loss = trainer.compute_loss

    def watched(model: Any, inputs: Any, **kw: Any) -> Any:  # the KL before each optimizer step
        seen.append(exact_kl(model, trainer.teacher_model))
        return compute_loss(model, inputs, **kw)

    trainer.compute_loss = watched  # type: ignore[method-assign]
    before = exact_kl(AutoModelForCausalLM.from_pretrained(tiny_model_dir), trainer.teacher_model)
    trainer.train()
    after = exact_kl(trainer.model, trainer.teacher_model)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    kls = [r["opd/reverse_kl"] for r in records if "opd/reverse_kl" in r]
    assert len(kls) == 10 and all(math.isfinite(k) for k in kls)
    assert abs(seen[0] - before) < 1e-5 and len(seen) == 10
    assert after < before - 0.05, (before, after, seen)
    assert sum(b < a for a, b in zip(seen, seen[1:] + [after])) >= 8, seen  # falling nearly every step


def test_opd_coef_beside_dapo_logs_the_reverse_kl_and_moves_the_loss(tiny_model_dir: str, teacher_dir: str,
                                                                   tmp_path: Path) -> None:
    from rlcore import GRPOTrainer

    def run(name: str, **kw: Any) -> list[dict[str, Any]]:
        trainer = GRPOTrainer(tiny_model_dir, reward_funcs=[_length], args=_args(tmp_path / name, **kw), train_dataset=_rows())
        trainer.train()
        return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    plain = run("plain", loss_type="dapo")
    both = run("both", loss_type="dapo", opd_coef=1.0, teacher_model=teacher_dir)
    assert "opd/reverse_kl" not in plain[0]
    assert both[0]["opd/reverse_kl"] > 0.5  # the same first samples (seed 0): the term is added on top
    assert abs(both[0]["loss"] - plain[0]["loss"]) > 0.1


@pytest.mark.parametrize("kw, needle", [
    (dict(loss_type="opd"), "loss_type=opd distils from a teacher: set teacher_model"),
    (dict(opd_coef=0.5), "opd_coef > 0 distils from a teacher: set teacher_model"),
    (dict(teacher_model="some/teacher"), "teacher_model='some/teacher' is set but nothing uses it"),
    (dict(opd_coef=-1.0, teacher_model="t"), "opd_coef must be a finite number >= 0, got -1.0"),
    (dict(loss_type="opd", opd_coef=1.0, teacher_model="t"), "loss_type=opd is the distillation loss alone"),
])
def test_opd_settings_without_a_teacher_or_a_use_are_one_line(kw: dict[str, Any], needle: str, tmp_path: Path) -> None:
    from rlcore.training.config import check_values

    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")) as info:
        check_values(_args(tmp_path / "run", **kw))
    assert "\n" not in str(info.value)


def test_a_teacher_with_another_vocabulary_is_one_line(tiny_model_dir: str, tmp_path: Path, capsys: Any) -> None:
    from rlcore.commands.cli import main

    other = _teacher_dir(tiny_model_dir, tmp_path / "wide", vocab=2048)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--dataset", str(rows), "--reward", "length_penalty", "--loss_type", "opd", "--teacher_model",
              other, "--max_steps", "1", "--output-dir", str(tmp_path / "run"), "--save-strategy", "no"])
    err = capsys.readouterr().err
    assert exit_info.value.code not in (0, None)
    assert "Traceback" not in err
    line = next(line for line in err.splitlines() if "teacher_model" in line)
    assert "has a vocabulary of 2048 tokens, the policy 1024" in line and line.startswith("Error:"), err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# --- the real model -------------------------------------------------------------------------------------
def test_smollm2_distilled_into_itself_has_zero_reverse_kl_and_zero_gradient(smollm2_dir: str, smollm2_tokenizer: Any) -> None:
    """The teacher is the student: every sampled token's advantage log p_t - log p_s is 0, so the
    reverse KL and the opd gradient are exactly 0 (2 short prompts, ≤ 16 tokens)."""
    from transformers import AutoModelForCausalLM

    student = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    student.eval()
    batch = _fixed_batch(smollm2_tokenizer)
    assert batch.input_ids.shape[1] <= 16
    _assert_self_distillation_is_zero(student, batch)


def test_smollm2_against_a_perturbed_copy_has_a_positive_kl_and_a_gradient(smollm2_dir: str, smollm2_tokenizer: Any) -> None:
    from transformers import AutoModelForCausalLM

    student = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in teacher.model.layers[-1].parameters():
            p.add_(torch.randn_like(p) * 0.05)
    student.eval()
    batch = _fixed_batch(smollm2_tokenizer)
    batch.teacher_logps = batch_logprobs(teacher, batch)
    loss, metrics = batch_loss(student, batch, opd_loss, LossConfig())
    loss.backward()
    assert metrics["opd/reverse_kl"] != 0.0 and torch.isfinite(loss)
    assert any(float(p.grad.abs().max()) > 0 for p in student.parameters() if p.grad is not None)


def test_the_tiny_model_distilled_into_itself_has_zero_reverse_kl_and_zero_gradient(tiny_model_dir: str,
                                                                                    tiny_tokenizer: Any) -> None:
    from transformers import AutoModelForCausalLM

    student = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    _assert_self_distillation_is_zero(student, _fixed_batch(tiny_tokenizer))


def _assert_self_distillation_is_zero(student: Any, batch: Any) -> None:
    """A model as its own teacher: reverse KL exactly 0, every gradient exactly 0."""
    batch.teacher_logps = batch_logprobs(student, batch)
    loss, metrics = batch_loss(student, batch, opd_loss, LossConfig())
    loss.backward()
    assert metrics["opd/reverse_kl"] == 0.0
    grads = [p.grad for p in student.parameters() if p.grad is not None]
    assert grads and all(float(g.abs().max()) == 0.0 for g in grads)


def test_the_loop_policy_takes_a_teacher_for_opd_alone_and_beside_grpo(tiny_model_dir: str, teacher_dir: str,
                                                                        tiny_tokenizer: Any) -> None:
    from rlcore.loop import Policy

    batch = _fixed_batch(tiny_tokenizer)
    alone = Policy(tiny_model_dir, loss="opd", teacher=teacher_dir, learning_rate=1e-3)
    out = alone.forward_backward(batch)
    assert out["opd/reverse_kl"] > 0.5 and math.isfinite(out["loss"])
    beside = Policy(tiny_model_dir, loss="grpo", teacher=teacher_dir, opd_coef=0.5)
    both = beside.forward_backward(batch)  # advantages 0: grpo's value is 0, the rest is 0.5 x the opd term
    assert abs(both["loss"] - 0.5 * out["loss"]) < 1e-4 and abs(both["opd/reverse_kl"] - out["opd/reverse_kl"]) < 1e-5
    with pytest.raises(ConfigError, match="loss_type='opd' needs a teacher: set teacher_model"):
        Policy(tiny_model_dir, loss="opd").forward_backward(batch)
