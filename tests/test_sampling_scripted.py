"""ScriptedSampler: the test double other tests build on must apply the real stop rules."""

from __future__ import annotations

import asyncio

import pytest

from rlcore import Completion, SamplerError, SamplingParams
from rlcore.testing import ScriptedSampler, fake_logprob


@pytest.fixture(scope="module")
def tok(tiny_model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


async def test_text_responses_in_order_with_eos(tok) -> None:
    s = ScriptedSampler(["move left", "stay"], tok)
    prompt = tok.encode("hello", add_special_tokens=False)
    a, b, c = [await s.generate(prompt, SamplingParams(max_tokens=50)) for _ in range(3)]
    assert (a.text, b.text, c.text) == ("move left", "stay", "move left")
    assert a.finish_reason == "stop" and a.token_ids[-1] == tok.eos_token_id
    assert a.token_ids[:-1] == tok.encode("move left", add_special_tokens=False)
    assert len(a.logprobs) == len(a.token_ids) and all(-3.0 <= lp < 0 for lp in a.logprobs)
    assert a.logprobs == [fake_logprob(prompt, i, t) for i, t in enumerate(a.token_ids)]
    assert c.logprobs == a.logprobs  # consistent: same prompt and tokens, same logprobs
    assert [p for p, _ in s.calls] == [prompt] * 3


async def test_max_tokens_stop_strings_and_token_ids(tok) -> None:
    s = ScriptedSampler(["the answer is 42. done"], tok)
    short = await s.generate([1], SamplingParams(max_tokens=2))
    assert short.finish_reason == "length" and len(short.token_ids) == 2
    cut = await s.generate([1], SamplingParams(max_tokens=50, stop=["."]))
    assert cut.finish_reason == "stop" and cut.text == "the answer is 42"
    ids = [5, 6, 7, 8]
    s2 = ScriptedSampler([ids])
    stopped = await s2.generate([1], SamplingParams(stop_token_ids=[7]))
    assert stopped.token_ids == [5, 6, 7] and stopped.finish_reason == "stop"


async def test_respond_function_failures_and_lifecycle(tok) -> None:
    s = ScriptedSampler(respond=lambda prompt, params, i: [100 + i, len(prompt)], fail_on=[1], delay=0.01)
    outs = await asyncio.gather(*(s.generate([1, 2, 3], SamplingParams()) for _ in range(3)), return_exceptions=True)
    assert outs[0].token_ids == [100, 3] and isinstance(outs[1], SamplerError) and outs[2].token_ids == [102, 3]
    ready = Completion(token_ids=[9], logprobs=None, finish_reason="length")
    assert (await ScriptedSampler([ready]).generate([1], SamplingParams())) is ready
    s.update_weights({"w": 1})
    assert s.policy_version == 1 and s.weight_updates == [{"w": 1}]
    s.sleep()
    assert s.asleep
    await s.close()
    with pytest.raises(SamplerError, match="closed"):
        await s.generate([1], SamplingParams())
    assert (await ScriptedSampler([[4]], logprobs=False).generate([1], SamplingParams())).logprobs is None
