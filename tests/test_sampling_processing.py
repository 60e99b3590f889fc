"""Per-row logits processing, the stop rules and the micro-batcher, on small real tensors / threads."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from rlcore import SamplerError, SamplingParams
from rlcore.sampling.batcher import MicroBatcher
from rlcore.sampling.processing import draw, row_tensors, sample_step, truncate
from rlcore.sampling.stops import StopChecker


def test_truncate_applies_each_rows_own_top_k_top_p_min_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4))
    params = [SamplingParams(top_k=2), SamplingParams(top_p=0.7), SamplingParams(min_p=0.5), SamplingParams()]
    kept = torch.isfinite(truncate(logits, row_tensors(params, 4, logits.device)))
    assert kept.tolist() == [
        [True, True, False, False],   # top-2
        [True, True, False, False],   # 0.5 + 0.3 reaches 0.7
        [True, True, False, False],   # ≥ 0.5 × 0.5
        [True, True, True, True],     # untouched
    ]


def test_draw_is_inverse_cdf() -> None:
    probs = torch.tensor([[0.25, 0.25, 0.5]] * 4)
    assert draw(probs, torch.tensor([0.0, 0.3, 0.55, 0.999])).tolist() == [0, 1, 2, 2]


def test_sample_step_logprobs_are_tempered_model_logprobs_not_truncated() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    params = [SamplingParams(temperature=0.5, top_k=3), SamplingParams(temperature=0.0), SamplingParams(temperature=1.5)]
    rows = row_tensors(params, 50, logits.device)
    tokens, lps = sample_step(logits, rows, torch.tensor([0.3, 0.3, 0.9]))
    assert tokens[0] in torch.topk(logits[0], 3).indices and tokens[1] == logits[1].argmax()
    temps = torch.tensor([[0.5], [1.0], [1.5]])
    expect = torch.log_softmax(logits / temps, -1).gather(1, tokens[:, None]).squeeze(1)
    assert torch.allclose(lps, expect)
    banned = torch.zeros(3, 50, dtype=torch.bool)
    banned[1, logits[1].argmax()] = True
    tokens2, _ = sample_step(logits, rows, torch.tensor([0.3, 0.3, 0.9]), banned=banned)
    assert tokens2[1] != logits[1].argmax()


def test_stop_checker_rules(tiny_model_dir: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok.encode("the answer is 42. done", add_special_tokens=False)
    c = StopChecker(tok, max_tokens=100, stop=[". "])
    finished_at = next(i for i, t in enumerate(ids) if c.add(t, -1.0))
    assert c.finish_reason == "stop" and c.text() == "the answer is 42" and len(c.token_ids) == finished_at + 1
    c2 = StopChecker(tok, max_tokens=3, stop_token_ids=[ids[5]])
    assert [c2.add(t, -1.0) for t in ids[:3]] == [False, False, True] and c2.finish_reason == "length"
    c3 = StopChecker(tok, max_tokens=10, stop_token_ids=[ids[0]], min_tokens=1)
    assert not c3.add(ids[0], -1.0)  # below min_tokens a stop token does not stop
    assert c3.add(ids[0], -1.0) and c3.finish_reason == "stop"


def test_fast_decoder_spells_what_decode_spells(tiny_model_dir: str) -> None:
    """Stop strings are checked with :func:`rlcore.chat_template.decoder` (the Rust tokenizer called
    directly): it must give exactly ``tokenizer.decode(ids, skip_special_tokens=False)`` — special
    tokens, byte fragments of multi-byte characters, anything — and a tokenizer it cannot vouch for
    (space clean-up on) keeps its own ``decode``."""
    import random

    from transformers import AutoTokenizer

    from rlcore.chat_template import _fast_decoder, decoder

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert _fast_decoder(tok) is not None  # the tiny tokenizer takes the fast path
    fast = decoder(tok)
    rng = random.Random(0)
    texts = ["naïve café — 数学 😀 <|im_end|>\n", "the answer is 42. done", "  spaces  and\ttabs\n\n"]
    seqs = [tok.encode(t, add_special_tokens=False) for t in texts]
    seqs += [[rng.randrange(len(tok)) for _ in range(rng.randrange(1, 20))] for _ in range(300)]  # fragments too
    for ids in seqs:
        for cut in range(len(ids) + 1):
            assert fast(ids[cut:]) == tok.decode(ids[cut:], skip_special_tokens=False), ids[cut:]
    cleaning = AutoTokenizer.from_pretrained(tiny_model_dir, clean_up_tokenization_spaces=True)
    assert _fast_decoder(cleaning) is None
    assert decoder(cleaning)(seqs[1]) == cleaning.decode(seqs[1], skip_special_tokens=False)


def test_micro_batcher_gathers_and_reports_failures() -> None:
    seen: list[list[int]] = []
    gate = threading.Event()

    def run(batch: list[int]) -> list[object]:
        gate.wait(5)
        seen.append(batch)
        if 13 in batch:
            raise RuntimeError("boom\nsecond line")
        return [x * 2 for x in batch]

    b: MicroBatcher[int] = MicroBatcher(run, window_s=0.05, max_batch_size=4)

    async def main() -> list[object]:
        futs = [b.submit_async(i) for i in range(6)]
        await asyncio.sleep(0.1)
        gate.set()
        return await asyncio.gather(*futs)

    assert asyncio.run(main()) == [0, 2, 4, 6, 8, 10]
    assert [len(x) for x in seen] == [4, 2]
    with pytest.raises(SamplerError, match="generation failed: RuntimeError: boom$"):
        b.submit(13).result(5)
    b.close()
    with pytest.raises(SamplerError, match="closed"):
        b.submit(1)
