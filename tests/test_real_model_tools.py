"""A tool conversation under the real SmolLM2-135M-Instruct chat template and tokenizer: the
``tool_scheduler`` running a real tool (rlcore's ``calculator``), then the real model answering.

How the tool path is forced: a 135M model does not emit a well-formed ``<tool_call>`` by itself
(and SmolLM2's template does not render tool schemas, so it is never shown them), so the first
assistant turn of each conversation is scripted — a :class:`~rlcore.testing.ScriptedSampler` with
the *real* tokenizer turns the call's text into SmolLM2's own BPE tokens (33 plain-text tokens:
the vocabulary has no ``<tool_call>`` token) and ends it with the real eos ``<|im_end|>`` (the
per-turn cap, 40 tokens, leaves the call room). Every later turn is sampled by the ``hf`` sampler
from the real model, from exactly the tokens the trajectory holds (the scripted call, SmolLM2's
rendering of the tool message, its assistant header).

Held: the calculator really ran (``19``); the tool message is in the stream as SmolLM2's template
renders it (``<|im_start|>tool\\n19<|im_end|>``, after the ``\\n`` the eos left open), loss mask 0;
every trained turn is what its sampler returned, token for token; the invariant checker and an
independent rendering agree; the trainer's scoring reproduces the real turns' logprobs; and the
prompt tokens include the default system prompt SmolLM2 injects before a first user message.
"""

from __future__ import annotations

from typing import Any

import pytest

from rlcore.chat_template import decode, encode_prompt, render
from rlcore.rollout import ToolScheduler, check_batch, run_rollouts
from rlcore.sampling.base import Sampler
from rlcore.testing import ScriptedSampler, assert_token_exact
from rlcore.testing.multi_turn import (RecordingSampler, assert_observations_are_template_deltas,
                                       assert_sampled_tokens_kept, trainer_logprobs)
from rlcore.types import Completion, Prompt, SamplingParams

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 + 7"}}\n</tool_call>'
QUESTION = "What is 12 + 7? Use the calculator tool, then answer with the number."


class FirstTurnScripted(Sampler):
    """The scripted sampler for a conversation's first turn (its prompt is one of ``first_prompts``),
    the real sampler for every other turn."""

    def __init__(self, scripted: Any, real: Any, first_prompts: list[list[int]]) -> None:
        self.scripted, self.real = scripted, real
        self.tokenizer = real.tokenizer
        self.first = {tuple(p) for p in first_prompts}
        self.real_calls = 0

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        if tuple(prompt_ids) in self.first:
            return await self.scripted.generate(prompt_ids, params)
        self.real_calls += 1
        return await self.real.generate(prompt_ids, params)


@pytest.mark.filterwarnings("ignore:the chat template .* does not render tool schemas")  # its own test below
async def test_real_template_tool_conversation_is_token_exact(smollm2_hf_sampler: Any, smollm2_tokenizer: Any) -> None:
    tok = smollm2_tokenizer
    messages = [{"role": "user", "content": QUESTION}]
    prompt_ids = encode_prompt(tok, messages)
    # the template starts a user-first conversation with its own system prompt, and ignores tool schemas
    assert decode(tok, prompt_ids).startswith(f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n<|im_start|>user\n")
    sched = ToolScheduler(None, tokenizer=tok, max_turns=3)
    assert encode_prompt(tok, messages, tools=sched.tool_schemas) == prompt_ids

    scripted = ScriptedSampler([CALL], tok)  # real tokenizer; ends the call with SmolLM2's eos
    sampler = RecordingSampler(FirstTurnScripted(scripted, smollm2_hf_sampler, [prompt_ids]))
    sched.sampler = sampler
    prompts = [Prompt([dict(m) for m in messages], list(prompt_ids)) for _ in range(2)]
    result = await run_rollouts(sched, prompts, num_generations=1,
                                sampling_params=SamplingParams(max_tokens=40, temperature=1.0), progress=False)
    trajs = result.trajectories
    assert result.stats["failed"] == 0, result.stats["failure_reasons"]
    assert check_batch(trajs, tok) == []
    assert_token_exact(trajs, tok)
    assert len(scripted.calls) == 2 and sampler.inner.real_calls >= 2

    eos = tok.convert_tokens_to_ids("<|im_end|>")
    for t in trajs:
        assert t.prompt_ids == prompt_ids == encode_prompt(tok, t.messages[:1])
        # turn 1: the scripted call, SmolLM2's BPE tokens of its text and the eos, kept as sampled
        first = t.turns[0]
        assert first.token_ids == tok.encode(CALL, add_special_tokens=False) + [eos] and set(first.loss_mask) == {1}
        assert t.messages[1] == {"role": "assistant", "content": CALL}
        # the calculator ran; its answer is a tool message rendered by SmolLM2's template
        assert t.messages[2] == {"role": "tool", "name": "calculator", "content": "19"}
        assert t.infos["tool_calls"] >= 1  # the model may imitate the call in a later turn: that runs too
        tool_turn = t.turns[1]
        assert tool_turn.role == "tool" and set(tool_turn.loss_mask) == {0}
        assert decode(tok, tool_turn.token_ids) == "\n<|im_start|>tool\n19<|im_end|>\n<|im_start|>assistant\n"
        with_tool = render(tok, t.messages[:3], add_generation_prompt=True)
        assert decode(tok, t.prompt_ids + first.token_ids + tool_turn.token_ids) == with_tool
        # then the real model answered (one or more turns), from exactly those tokens
        assert t.num_turns >= 2 and t.turns[2].role == "assistant" and t.messages[3]["role"] == "assistant"
        assert assert_observations_are_template_deltas(t, tok) == t.num_turns - 1
        assert assert_sampled_tokens_kept(t, sampler.records) == t.num_turns

    # the real turns' logprobs are the model's: the trainer's scoring of the packed batch reproduces
    # them (the scripted call's are the ScriptedSampler's stand-ins, so it is left out)
    for t, rescored in zip(trajs, trainer_logprobs(trajs, smollm2_hf_sampler.model, tok.pad_token_id)):
        at, checked = 0, 0
        for k, turn in enumerate(t.turns):
            if k >= 2 and any(turn.loss_mask):
                for have, want in zip(rescored[at:at + len(turn.token_ids)], turn.logprobs):
                    assert abs(have - want) < 1e-4, (k, have, want)
                    checked += 1
            at += len(turn.token_ids)
        assert checked > 0


def test_a_template_that_ignores_tools_is_named(smollm2_dir: str, tiny_tokenizer: Any) -> None:
    """SmolLM2's template has no ``tools`` block: tool schemas passed to it vanish from the prompt,
    and a tool run would train a model never told its tools. The tool scheduler says so, once."""
    from transformers import AutoTokenizer

    from rlcore.rollout.tools import warn_if_tools_not_rendered

    tok = AutoTokenizer.from_pretrained(smollm2_dir)  # a fresh tokenizer: the warning is once per tokenizer
    sched = ToolScheduler(None, tokenizer=tok, max_turns=2)
    with pytest.warns(UserWarning, match=r"does not render tool schemas: the model is never shown the tools \(calculator\)"):
        sched.on_trajectory_start([])
    assert warn_if_tools_not_rendered(tok, sched.tool_schemas) is True
    assert warn_if_tools_not_rendered(tiny_tokenizer, sched.tool_schemas) is False  # the tiny ChatML renders them
