"""``padding_free=True`` (#31 item 5): a micro-batch's sequences run end to end with per-sequence
``position_ids`` (rows of ``padding_free_max_tokens`` with a block-diagonal causal mask under
sdpa/eager, one row under flash-attention) and every number the padded path gives comes out the
same in float32: each loss and its gradient, the logprobs, entropies, reference and teacher
logprobs, a two-step ``GRPOTrainer`` run's weights, the loop API's. A model whose attention cannot
take packed input is one line naming it."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

import rlcore
from rlcore.algorithms.entropy import EntropyBonus
from rlcore.algorithms.logprobs import PaddingFree, check_padding_free, completion_logprobs, padding_free_plan
from rlcore.algorithms.losses import LossConfig
from rlcore.errors import ConfigError
from rlcore.loop.loss import batch_logprobs, batch_loss
from rlcore.testing import tiny_model_path
from rlcore.types import Batch

#: a long-tailed spread of sequence lengths (prompt + completion), as GSM8K-like completions give
LENGTHS = [23, 61, 9, 14, 38, 17, 12, 30]
T = 64  # the generation batch's width: every row is right-padded to it


def _model(arch: str = "qwen2", **kw: Any) -> Any:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_path(arch=arch), dtype=torch.float32, **kw)


@pytest.fixture(scope="module")
def model() -> Any:
    return _model()


def make_batch(lengths: list[int] = LENGTHS, width: int = T, seed: int = 0, vocab: int = 1000) -> Batch:
    """A right-padded batch with prompts, completions, token advantages, sampler/old/reference/teacher
    logprobs near the model's, one row that is failed (all-zero completion mask) and one whose
    sampler logprobs are incomplete."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    ids = torch.randint(3, vocab, (B, width), generator=g)
    attn = torch.zeros(B, width, dtype=torch.long)
    cmask = torch.zeros(B, width)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
        cmask[i, max(1, n // 3): n] = 1
        ids[i, n:] = 0
    cmask[2] = 0  # a failed trajectory stays in the batch, untrained
    adv = torch.randn(B, 1, generator=g).expand(B, width) * cmask
    base = -6.9 + 0.3 * torch.randn(B, width, generator=g)
    batch = Batch(ids, attn, cmask, adv.contiguous(), base * cmask, torch.ones(B, dtype=torch.bool))
    batch.is_valid[5] = False
    batch.old_logps = (base + 0.05 * torch.randn(B, width, generator=g)) * cmask
    batch.ref_logps = (base + 0.1 * torch.randn(B, width, generator=g)) * cmask
    batch.teacher_logps = (base + 0.2 * torch.randn(B, width, generator=g)) * cmask
    return batch


def builtin_losses() -> list[str]:
    from rlcore.plugins import plugins

    return [n for r in plugins().list() if r.builtin for n in r.components.get("loss", [])]


LOSSES = ["grpo", "bnpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "luspo", "vespo", "opd"]


def test_every_builtin_loss_is_covered() -> None:
    assert sorted(builtin_losses()) == sorted(LOSSES)


def loss_and_grads(model: Any, batch: Batch, name: str, pf: PaddingFree | None, **kw: Any) -> tuple[Any, dict, list]:
    model.zero_grad(set_to_none=True)
    loss_fn = rlcore.get("loss", name)
    cfg = LossConfig(beta=0.04, epsilon_high=0.28, num_items=float(batch.completion_mask.sum()) * 1.5,
                     **kw.pop("cfg", {}))
    loss, metrics = batch_loss(model, batch, loss_fn, cfg, padding_free=pf, **kw)
    loss.backward()
    return float(loss.detach()), metrics, [p.grad.clone() for p in model.parameters()]


def assert_same(a: tuple, b: tuple) -> None:
    (la, ma, ga), (lb, mb, gb) = a, b
    assert la == pytest.approx(lb, abs=1e-6, rel=0)
    assert set(ma) == set(mb)
    for k in ma:
        assert ma[k] == pytest.approx(mb[k], abs=1e-6, rel=0), k
    scale = max(float(g.abs().max()) for g in gb)
    assert scale > 0  # the loss trains something
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6 * scale)


@pytest.mark.parametrize("name", LOSSES)
def test_each_loss_and_its_gradient_are_the_padded_ones(model: Any, name: str) -> None:
    batch = make_batch()
    padded = loss_and_grads(model, batch, name, None)
    for pf in (PaddingFree(), PaddingFree(max_tokens=256, pad_to_multiple_of=48)):
        assert_same(loss_and_grads(model, batch, name, pf), padded)


@pytest.mark.parametrize("extra", [
    dict(use_sampler_logps=True, cfg=dict(is_correction="token_truncate")),
    dict(use_sampler_logps=True, cfg=dict(is_correction="sequence_mask", importance_sampling_level="sequence")),
    dict(top_entropy_quantile=0.4),
    dict(cfg=dict(opd_coef=0.5, off_policy_mask_threshold=0.3)),
    dict(entropy="adaptive"),
], ids=["token-is", "sequence-is", "top-entropy", "opd-beside-grpo+opsm", "entropy-bonus"])
def test_the_terms_that_ride_along_are_the_padded_ones(model: Any, extra: dict) -> None:
    """Importance-sampling correction, the high-entropy token mask (a quantile over the batch's
    tokens), opd beside grpo, off-policy masking and an entropy bonus with its gradient."""
    batch = make_batch(seed=3)
    runs = []
    for pf in (None, PaddingFree(max_tokens=90)):
        kw = dict(extra)
        if kw.pop("entropy", None):
            from types import SimpleNamespace

            kw["entropy_bonus"] = EntropyBonus.from_args(SimpleNamespace(
                entropy_coef=0.05, use_adaptive_entropy=False, entropy_coef_min=0.0, entropy_coef_max=1.0,
                entropy_coef_delta=0.005, entropy_target=0.2))
        runs.append(loss_and_grads(model, batch, "grpo", pf, **kw))
    assert_same(runs[1], runs[0])


def test_moe_load_balancing_loss_is_the_padded_one() -> None:
    """qwen2_moe with router_aux_loss_coef: the router's loss averages over the packed rows' real tokens."""
    from rlcore.training.model_options import router_aux

    moe = _model("qwen2_moe")
    aux = router_aux(moe, 0.01)
    batch = make_batch(seed=4)
    padded = loss_and_grads(moe, batch, "grpo", None, router_aux=aux)
    assert padded[1]["aux_loss"] > 0
    assert_same(loss_and_grads(moe, batch, "grpo", PaddingFree(max_tokens=80), router_aux=aux), padded)


def test_logprobs_and_entropies_are_the_padded_ones_and_the_layout_is_packed(model: Any) -> None:
    batch = make_batch()
    lp0, ent0 = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_mask,
                                    entropy=True, pack=False)
    for pf, rows, width in ((PaddingFree(), 4, 61), (PaddingFree(max_tokens=120), 2, 120),
                            (PaddingFree(max_tokens=40), 4, 61),  # a 61-token row widens the rows to 61
                            (PaddingFree(max_tokens=120, pad_to_multiple_of=64), 2, 128)):
        plan = padding_free_plan(model, batch.attention_mask, pf)
        assert (plan.rows, plan.width) == (rows, width)
        assert int(plan.token_mask.sum()) == sum(LENGTHS)  # every real token once, nothing else
        lp, ent = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_mask,
                                      entropy=True, padding_free=pf)
        torch.testing.assert_close(lp, lp0, rtol=0, atol=1e-6)
        torch.testing.assert_close(ent, ent0, rtol=0, atol=1e-6)
        assert float((lp.detach() * (1 - batch.completion_mask)).abs().sum()) == 0.0
    rows_at_a_time = batch_logprobs(model, batch, rows_per_pass=3, padding_free=PaddingFree())
    torch.testing.assert_close(rows_at_a_time, lp0, rtol=0, atol=1e-6)


def test_eager_attention_and_qwen3_pack_too() -> None:
    batch = make_batch(seed=5)
    for m in (_model(attn_implementation="eager"), _model("qwen3")):
        check_padding_free(m)
        lp0 = batch_logprobs(m, batch)
        torch.testing.assert_close(batch_logprobs(m, batch, padding_free=PaddingFree(max_tokens=128)), lp0,
                                   rtol=0, atol=1e-6)


def test_smollm2_logprobs_are_the_padded_ones(smollm2_dir: str) -> None:
    """The real SmolLM2-135M (llama, 30 layers), float32: the padding-free logprobs and entropies of
    a long-tailed batch are the padded ones."""
    m = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    check_padding_free(m)
    batch = make_batch([70, 12, 33, 5, 21, 48], width=80, seed=6, vocab=int(m.config.vocab_size))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # several threads split SmolLM2's reductions by shape: ~1e-4 in the entropy, either way
    try:
        with torch.no_grad():
            lp0, ent0 = completion_logprobs(m, batch.input_ids, batch.attention_mask, batch.completion_mask,
                                            entropy=True, pack=False)
            lp1, ent1 = completion_logprobs(m, batch.input_ids, batch.attention_mask, batch.completion_mask,
                                            entropy=True, padding_free=PaddingFree(max_tokens=96))
    finally:
        torch.set_num_threads(threads)
    assert padding_free_plan(m, batch.attention_mask, PaddingFree(max_tokens=96)).rows == 2
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=1e-6)
    assert float(lp0.abs().sum()) > 0


# --- the trainer: two optimizer steps, with gradient accumulation and μ=2 ---------------------------------
class SpreadRollout:
    """A TRL ``rollout_func`` with fixed completions of a long-tailed length spread (2–40 tokens)."""

    SIZES = (2, 31, 5, 17, 40, 3, 9, 25)

    def __init__(self) -> None:
        self.__name__ = "spread_rollout"
        self.calls = 0

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        tok = trainer.processing_class
        gen = torch.Generator().manual_seed(99 + self.calls)
        self.calls += 1
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for i, p in enumerate(prompts):
            n = self.SIZES[i % len(self.SIZES)]
            out["prompt_ids"].append(list(tok.encode(p)))
            out["completion_ids"].append(torch.randint(10, 900, (n,), generator=gen).tolist())
            out["logprobs"].append([-6.9] * n)
        return out


def r_len(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    return [float(len(c) % 5) + (c[0] % 3) for c in completion_ids]


def train_two_steps(tmp: Any, **over: Any) -> tuple[Any, list[float]]:
    args = rlcore.GRPOConfig(
        output_dir=str(tmp), per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4,
        num_iterations=2, max_completion_length=40, max_steps=2, beta=0.04, loss_type="dapo",
        logging_steps=1, report_to="none", use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True,
        seed=0, plots=False, **over)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=[r_len], args=args,
                               train_dataset=[{"prompt": f"What is {i} + 1?"} for i in range(8)],
                               rollout_func=SpreadRollout())
    losses: list[float] = []
    compute = t.compute_loss

    def record(model: Any, inputs: Any, *a: Any, **k: Any) -> Any:
        loss = compute(model, inputs, *a, **k)
        losses.append(float(loss.detach()))
        return loss

    t.compute_loss = record
    t.train()
    return t, losses


def test_grpo_trainer_two_steps_padding_free_end_with_the_padded_weights(tmp_path: Any) -> None:
    """dapo (the generation batch's token count as normaliser), gradient accumulation over two
    micro-batches, μ=2 and a KL term. Plain SGD, so the weights are the gradients' sum: AdamW
    divides each gradient by its own running size and so magnifies float rounding in near-zero
    gradients (measured 2.9e-6 in weights, padded or not alike)."""
    padded, lp = train_two_steps(tmp_path / "padded", optim="sgd", learning_rate=0.1)
    packed, lf = train_two_steps(tmp_path / "packed", padding_free=True, padding_free_max_tokens=64, optim="sgd",
                                 learning_rate=0.1)
    assert packed.padding_free == PaddingFree(64, None) and padded.padding_free is None
    assert len(lf) == len(lp) == 4  # the same micro-steps: 2 optimizer steps × 2 accumulated micro-batches
    assert lf == pytest.approx(lp, abs=1e-6, rel=0)
    start = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32)
    moved = 0.0
    for (name, a), b, s in zip(packed.model.named_parameters(), padded.model.parameters(), start.parameters()):
        a, b = a.detach(), b.detach()
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
        moved = max(moved, float((b.detach() - s).abs().max()))
    assert moved > 1e-3  # the two steps moved the weights


# --- the loop API -------------------------------------------------------------------------------------------
def test_loop_policy_padding_free_takes_the_padded_steps() -> None:
    from rlcore.loop import Policy

    batch = make_batch(seed=7)
    batch.old_logps = batch.teacher_logps = None
    out = []
    for pf in (False, True):
        torch.manual_seed(0)
        # adam_epsilon 1e-4: with 1e-8, Adam turns a rounding-level difference in a near-zero gradient
        # (packed and padded rows sum in another order) into an update of up to the learning rate
        # (seen: 1.9e-6 in one weight of 4,096 with transformers 5.24); above 1e-4 it steps as usual
        policy = Policy(tiny_model_path(), loss="grpo", beta=0.04, learning_rate=1e-3, padding_free=pf,
                        padding_free_max_tokens=100 if pf else None, adam_epsilon=1e-4)
        metrics = []
        for _ in range(2):
            old = policy.logprobs(batch)
            metrics.append(policy.forward_backward(copy.copy(batch), old_logps=old))
            policy.clip_grad_and_step()
        out.append((policy, metrics, policy.logprobs(batch), policy.ref_logprobs(batch)))
    (p0, m0, lp0, ref0), (p1, m1, lp1, ref1) = out
    assert p1.padding_free == PaddingFree(100) and p0.padding_free is None
    for a, b in zip(m1, m0):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6, rel=0)
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-5)
    torch.testing.assert_close(ref1, ref0, rtol=0, atol=1e-6)
    start = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32)
    moved = 0.0
    for a, b, s in zip(p1.model.parameters(), p0.model.parameters(), start.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)  # AdamW: its rounding scales with the learning rate
        moved = max(moved, float((b.detach() - s).abs().max()))
    assert moved > 1e-4


# --- bad input: one line each --------------------------------------------------------------------------------
def tiny_opt() -> Any:
    """OPT computes its learned positions from the attention mask, not from position_ids: packed
    sequences after the first get the wrong positions."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    return OPTForCausalLM(OPTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, ffn_dim=64,
                                    vocab_size=1024, word_embed_proj_dim=32))


def test_a_model_that_cannot_take_packed_input_is_one_line() -> None:
    from rlcore.loop import Policy
    from rlcore.testing import load_tiny

    _, tok = load_tiny()
    with pytest.raises(ConfigError, match=r"^padding_free: OPTForCausalLM \(opt, attn_implementation='sdpa'\) does not "
                                          r"keep packed sequences apart .* train it with padding_free=False"):
        Policy(tiny_opt(), tok, padding_free=True)
    Policy(tiny_opt(), tok)  # padded, it trains as before


def test_bad_settings_are_one_line(tmp_path: Any, model: Any) -> None:
    with pytest.raises(ConfigError, match=r"^padding_free_max_tokens must be a positive number of tokens .* got 0$"):
        rlcore.training.config.check_values(rlcore.GRPOConfig(output_dir=str(tmp_path / "a"), padding_free=True,
                                                               padding_free_max_tokens=0))
    with pytest.raises(ConfigError, match=r"^padding_free_max_tokens=512 is set but padding_free is off"):
        rlcore.training.config.check_values(rlcore.GRPOConfig(output_dir=str(tmp_path / "b"), padding_free_max_tokens=512))
    batch = make_batch()
    left = batch.attention_mask.flip(1)  # left padding: not what a Batch holds
    with pytest.raises(ConfigError, match=r"^padding_free packs right-padded rows"):
        completion_logprobs(model, batch.input_ids, left, batch.completion_mask.flip(1), padding_free=PaddingFree())


def test_flash_attention_layout_is_one_row_with_its_sequence_boundaries(model: Any) -> None:
    """Under flash-attention the micro-batch is one row and the varlen kernels get each sequence's
    start (the layout only: the kernels themselves need a GPU with flash_attn)."""
    from rlcore.algorithms.logprobs import varlen_kwargs

    batch = make_batch()
    fa = copy.deepcopy(model.config)
    fa._attn_implementation = "flash_attention_2"
    holder = type("M", (), {"config": fa})()
    for pf, width in ((PaddingFree(max_tokens=40), sum(LENGTHS)), (PaddingFree(pad_to_multiple_of=64), 256)):
        plan = padding_free_plan(holder, batch.attention_mask, pf)
        assert (plan.rows, plan.width) == (1, width)
        kw = varlen_kwargs(plan)
        ends = torch.tensor([LENGTHS[i] for i in plan.bins[0]]).cumsum(0).tolist()
        ends[-1] = width  # the tail padding continues the last sequence
        assert kw["cu_seq_lens_q"].tolist() == [0, *ends] and kw["cu_seq_lens_k"] is kw["cu_seq_lens_q"]
        assert kw["max_length_q"] == kw["max_length_k"] == max(b - a for a, b in zip([0, *ends], ends))
        starts = (plan.position_ids[0] == 0).nonzero().flatten().tolist()
        assert starts == [0, *ends[:-1]]  # position ids restart exactly where the kernels cut


@pytest.mark.slow
def test_two_data_parallel_ranks_padding_free_train_like_one_padded_process(tmp_path: Any) -> None:
    """``torchrun --nproc_per_node 2`` with padding_free: each rank packs its own micro-batches, the
    normalisers come from the whole batch before packing, and the weights after two SGD steps are
    one padded process's (``tests/dp_run.py``, as ``tests/test_data_parallel.py`` runs it)."""
    import json
    from pathlib import Path

    from rlcore.testing.runs import launch_ranks

    script = Path(__file__).with_name("dp_run.py")
    runs = {}
    for name, ranks, extra in (("one", 1, []), ("two", 2, ["padding_free"])):
        out = tmp_path / name
        launch_ranks(script, ranks, out, 16 // ranks, "dapo", "batch", *extra)
        runs[name] = (torch.load(out / "weights.pt"), json.loads((out / "logs.json").read_text()))
    (w1, l1), (w2, l2) = runs["one"], runs["two"]
    assert l2["world_size"] == 2
    moved = max((w1[n] - w2[n]).abs().max().item() for n in w1)
    assert moved < 1e-5, f"weights differ by {moved} between 2 padding-free ranks and 1 padded process"
    for a, b in zip(l1["logs"], l2["logs"]):
        for key in ("policy_loss", "entropy", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key


def test_per_turn_samples_padding_free_score_what_the_sampler_sampled(tiny_model_dir: str, tiny_tokenizer: Any,
                                                                       tiny_hf_sampler: Any) -> None:
    """Multi-turn episodes under a template that rewrites the history train as one row per turn
    (``expand_turn_samples``); padding-free, every trained token of those rows gets the logprob the
    real sampler reported when it sampled it, and the loss is the padded one."""
    import asyncio

    from rlcore.loop import Policy
    from rlcore.loop.loss import pack
    from rlcore.rollout import encode_prompt, run_rollouts
    from rlcore.testing.multi_turn import AskAgain
    from rlcore.types import Prompt, SamplingParams

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = "{{ messages | length }} messages\n" + tiny_tokenizer.chat_template  # rewrites the history
    msgs = [{"role": "user", "content": "count with me"}]
    res = asyncio.run(run_rollouts(AskAgain(tiny_hf_sampler, tokenizer=tok, max_turns=3),
                                   [Prompt(msgs, encode_prompt(tok, msgs))], num_generations=4,
                                   sampling_params=SamplingParams(max_tokens=6, temperature=1.0), progress=False))
    trajs = [t for t in res.trajectories if t.status != "failed"]
    assert len(trajs) == 4 and all(t.has_turn_samples for t in trajs)
    adv = [1.0, -1.0, 0.5, -0.5]
    padded = Policy(tiny_model_dir, tok, loss="grpo", learning_rate=0.0)
    packed = Policy(tiny_model_dir, tok, loss="grpo", learning_rate=0.0, padding_free=True)
    batch = pack(trajs, adv, packed.pad_token_id)
    assert batch.size == sum(t.num_turns for t in trajs) == 12
    on = batch.completion_mask.bool()
    got = packed.logprobs(trajs)
    assert torch.allclose(got[on], batch.sampler_logps[on], atol=1e-4), (got[on] - batch.sampler_logps[on]).abs().max()
    torch.testing.assert_close(got, padded.logprobs(trajs), rtol=0, atol=1e-6)
    a, b = packed.forward_backward(trajs, adv), padded.forward_backward(trajs, adv)
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6, rel=0) and a["num_tokens"] == float(on.sum())
