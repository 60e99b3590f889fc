"""Where SmolLM2-135M-Instruct's real chat template and 49k byte-level BPE differ from the tiny
model's hand-made ChatML, and what rlcore makes of it.

* SmolLM2's template starts a conversation whose first message is not a system message with its
  own system prompt. The prompt tokens the trainer scores must hold it exactly: rlcore's data
  path encodes the template's rendering, so they do, up to the packed batch the loss consumes.
* A scheduler that prepends a system message in ``on_trajectory_start`` (ms-swift's GYMScheduler
  does) without re-encoding the prompt: the dataset row's tokens carry the *default* system
  prompt, which the new messages no longer render, so rlcore re-encodes the prompt from the
  messages and the model really sees (and the trainer scores) the scheduler's system message.
* A character the BPE spells with several byte tokens (an emoji) cut by ``max_tokens`` between
  them, and the model continuing the same assistant message: each sample decodes alone to a
  replacement character, so the message text must come from decoding the message's tokens
  together (it did not: the trajectory failed an invariant check for tokens that were exact).
"""

from __future__ import annotations

from typing import Any


import rlcore
from rlcore.chat_template import decode, encode_prompt, render
from rlcore.rollout import MultiTurnScheduler, check_batch, run_rollouts
from rlcore.testing import ScriptedSampler, assert_token_exact
from rlcore.testing.multi_turn import RecordingSampler, assert_observations_are_template_deltas, assert_sampled_tokens_kept
from rlcore.data.cursor import make_prompt
from rlcore.types import Batch, Prompt, SamplingParams

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
OWN_SYSTEM = "You are a terse assistant. Answer in one word."


async def test_injected_system_prompt_is_in_the_tokens_the_trainer_scores(smollm2_hf_sampler: Any, smollm2_tokenizer: Any) -> None:
    tok = smollm2_tokenizer
    row = {"prompt": [{"role": "user", "content": "Name a colour."}], "answer": "red"}
    prompt = make_prompt(row, tok, has_prompt=True, max_prompt_length=512)
    want = f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"
    assert prompt.messages == row["prompt"]  # the messages are the row's; the template adds the system prompt
    assert decode(tok, prompt.prompt_ids) == want == render(tok, prompt.messages, add_generation_prompt=True)
    assert prompt.prompt_ids == tok.encode(want, add_special_tokens=False)

    sched = rlcore.get("scheduler", "default")(smollm2_hf_sampler)
    result = await run_rollouts(sched, [prompt], num_generations=2, sampling_params=SamplingParams(max_tokens=8), progress=False)
    trajs = result.trajectories
    assert result.stats["failed"] == 0 and check_batch(trajs, tok) == []
    assert_token_exact(trajs, tok)
    batch = Batch.from_trajectories(trajs, [1.0, -1.0], pad_token_id=tok.pad_token_id)
    p = len(prompt.prompt_ids)
    for i, t in enumerate(trajs):
        assert batch.input_ids[i, :p].tolist() == prompt.prompt_ids  # scored as context, system prompt included
        assert batch.completion_mask[i, :p].sum() == 0 and batch.completion_mask[i, p:p + len(t.completion_ids)].sum() > 0


class PrependsSystem(MultiTurnScheduler):
    """Puts its own system message before the dataset's conversation and leaves ``prompt_ids``
    alone (as ms-swift's GYMScheduler does); asks again after each answer."""

    def on_trajectory_start(self, trajectories: list[Any]) -> None:
        for t in trajectories:
            t.messages.insert(0, {"role": "system", "content": OWN_SYSTEM})

    def step(self, infer_request: Any, response_choice: Any, current_turn: int) -> dict[str, Any]:
        infer_request.messages.append({"role": "user", "content": "And another one?"})
        return {"infer_request": infer_request}

    def check_finished(self, infer_request: Any, response_choice: Any, current_turn: int) -> bool:
        return current_turn >= self.max_turns


async def test_a_prepended_system_message_reaches_the_model_and_the_prompt_tokens(smollm2_hf_sampler: Any,
                                                                                   smollm2_tokenizer: Any) -> None:
    tok = smollm2_tokenizer
    messages = [{"role": "user", "content": "Name a colour."}]
    row_ids = encode_prompt(tok, messages)
    assert SMOLLM2_SYSTEM in decode(tok, row_ids)  # what the dataset row encoded: the default system prompt
    sampler = RecordingSampler(smollm2_hf_sampler)
    sched = PrependsSystem(sampler, max_turns=2, tokenizer=tok)
    prompts = [Prompt([dict(m) for m in messages], list(row_ids))]
    result = await run_rollouts(sched, prompts, num_generations=2, sampling_params=SamplingParams(max_tokens=8), progress=False)
    trajs = result.trajectories
    assert result.stats["failed"] == 0, result.stats["failure_reasons"]
    assert check_batch(trajs, tok) == []
    assert_token_exact(trajs, tok)
    want = encode_prompt(tok, [{"role": "system", "content": OWN_SYSTEM}, *messages])
    assert [r[0] for r in sampler.records[:2]] == [want, want]  # the model was given the scheduler's system message
    for t in trajs:
        assert t.messages[0] == {"role": "system", "content": OWN_SYSTEM}
        assert t.prompt_ids == want and t.infos.get("prompt_reencoded") is True
        assert SMOLLM2_SYSTEM not in decode(tok, t.prompt_ids) and OWN_SYSTEM in decode(tok, t.prompt_ids)
        assert t.num_turns == 2
        assert assert_observations_are_template_deltas(t, tok) == 1
        assert assert_sampled_tokens_kept(t, sampler.records) == 2


class ContinuesAfterLength(MultiTurnScheduler):
    """Lets the model go on with the same assistant message after a reply cut by ``max_tokens``
    (a scheduler that budgets a long answer in pieces)."""

    def check_finished(self, infer_request: Any, response_choice: Any, current_turn: int) -> bool:
        return current_turn >= self.max_turns


async def test_a_continuation_that_completes_a_split_character_keeps_its_text(smollm2_tokenizer: Any) -> None:
    tok = smollm2_tokenizer
    reply = "Hi 😀 there, all 🎉 done"
    ids = tok.encode(reply, add_special_tokens=False)
    pieces = [decode(tok, [i]) for i in ids]
    cut = next(k for k, p in enumerate(pieces) if "\ufffd" in p) + 1  # inside the emoji's byte tokens
    assert "\ufffd" in decode(tok, ids[:cut]) and decode(tok, ids) == reply
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    # three samples of one message: cut inside 😀, then inside 🎉 (or later), then the rest and the eos
    second = next(k for k in range(cut + 1, len(ids)) if "\ufffd" in decode(tok, ids[:k]) and decode(tok, ids[:k]) != decode(tok, ids[:cut]))
    chunks = [ids[:cut], ids[cut:second], ids[second:] + [eos]]
    sampler = ScriptedSampler(chunks, tok)
    sched = ContinuesAfterLength(sampler, max_turns=3, tokenizer=tok)
    messages = [{"role": "user", "content": "Say hi."}]
    params = SamplingParams(max_tokens=max(len(c) for c in chunks))
    result = await run_rollouts(sched, [Prompt(messages, encode_prompt(tok, messages))], sampling_params=params, progress=False)
    (t,) = result.trajectories
    assert t.status == "ok", t.reason
    assert [turn.token_ids for turn in t.turns] == chunks and all(set(turn.loss_mask) == {1} for turn in t.turns)
    assert t.messages[-1] == {"role": "assistant", "content": reply}
    assert check_batch([t], tok) == []
    assert_token_exact([t], tok)
    assert decode(tok, t.input_ids) == render(tok, t.messages)[:-1]  # all but the "\n" after the eos
