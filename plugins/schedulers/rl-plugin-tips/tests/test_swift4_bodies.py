"""ms-swift 4.6.0's tip schedulers, their class bodies unchanged, running on rlcore.

``ThinkingModelTipsScheduler`` and ``MathTipsScheduler`` below are ms-swift 4.6.0's
(``swift/rollout/multi_turn.py`` lines 584-736 and 738-836; Copyright (c) ModelScope Contributors,
Apache License 2.0, https://github.com/modelscope/ms-swift/blob/main/LICENSE), kept verbatim as
compatibility fixtures. Only import lines differ: the module's imports above them, and the one
import inside each class (``from swift.rewards.orm import MathAccuracy`` became
``from rl_plugin_tips.accuracy import MathAccuracy``). The rest of this module is rlcore's.

What they do on rlcore, exactly as docs/porting-ms-swift.md says:

* ``MathTipsScheduler``: an answer with ``</think>``/``<answer>`` is cut before it, the tip appended
  (untrained) and the model continues the same message — token-exact and sound. An answer with
  neither keeps the sampled ``<|im_end|>`` before the tip in its ``response_token_ids``: that
  trajectory fails as an invariant violation showing it (ms-swift trains it).
* ``ThinkingModelTipsScheduler``: rlcore has no ms-swift template object, so its history builder
  takes its fallback, which puts a bare string in the messages from the second round on: round 1 is
  trained, each later round's output fails with that reason (rl-plugin-tips' own
  ``thinking_tips_scheduler`` is the working equivalent).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rlcore import SamplingParams
from rlcore.rollout import build_scheduler, check_batch, encode_prompt, run_rollouts
from rlcore.testing import ScriptedSampler
from rlcore.types import Prompt, Trajectory

# --- the import lines: ms-swift 4.6.0's, changed to rlcore's -----------------------------------------
# ms-swift: from typing import Any, Dict, List, Optional, Union
# ms-swift: from swift.infer_engine.protocol import RolloutOutput   (and the request/response types, hints only)
# ms-swift: from swift.rollout import MultiTurnScheduler
# ms-swift: from swift.template import Messages
from typing import Dict, List, Optional, Union  # noqa: E402,F401

from rlcore import Messages, MultiTurnScheduler  # noqa: E402
from rlcore.rollout import RolloutOutput  # noqa: E402


# ====== ms-swift 4.6.0 (Apache-2.0), swift/rollout/multi_turn.py lines 584-736, verbatim but for one import ====
class ThinkingModelTipsScheduler(MultiTurnScheduler):
    """
    Scheduler for multi-turn reasoning with Thinking class models.

    Key Features:
    1. Parses both "think" and "answer" content from each assistant response.
    2. For each round, only the "think" content from the last round is retained in the message history.
    3. Each round's conversation history is processed independently.
    4. Returns a list of RolloutOutput objects, one for each round.
    5. Please set `--loss_scale last_round` for training last round response.

    The scheduler will automatically inject a tip prompt if the answer is incorrect, encouraging the model to recheck its reasoning. # noqa
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        acc_func = kwargs.get('acc_function', None)
        if acc_func is None:
            from rl_plugin_tips.accuracy import MathAccuracy
            acc_func = MathAccuracy()
        self.acc_func = acc_func
        self.tips_prompt = 'The answer is not correct, It seems You made a mistake, you need to recheck very carefully.'

    async def run(self, infer_request: 'RolloutInferRequest', request_config: 'RequestConfig',
                  **kwargs) -> List['RolloutOutput']:
        """
        Execute multi-turn inference for Thinking models.

        Args:
            infer_request (RolloutInferRequest): The initial inference request containing the conversation history.
            request_config (RequestConfig): Configuration for the inference request.
            **kwargs: Additional arguments for the inference engine.

        Returns:
            List[RolloutOutput]: A list of RolloutOutput objects, one for each reasoning round.
        """
        current_request = infer_request
        current_turn = 1
        rollout_outputs = []

        while True:
            messages = current_request.messages
            # Obtain model response for the current turn
            response: 'ChatCompletionResponse' = await self.infer_engine.infer_async(
                current_request, request_config, **kwargs)
            response_choice: 'ChatCompletionResponseChoice' = response.choices[0]
            completion = response_choice.message.content

            # Append the assistant's response to the message history
            messages.append({'role': 'assistant', 'content': completion})

            # Construct the message history for this round, keeping only the last "think" content
            messages_with_last_think = self._build_messages(messages)

            # Create a RolloutOutput for the current round
            round_output = RolloutOutput(
                response=response,
                messages=messages_with_last_think,
                response_token_ids=response_choice.token_ids,
                rollout_infos={'num_turns': current_turn})
            # Store the output for this round
            rollout_outputs.append(round_output)

            # Determine whether to stop the multi-turn reasoning
            should_stop = self.check_finished(current_request, response_choice, current_turn)

            if should_stop:
                break

            # Prepare for the next turn by updating the inference request
            ret = self.step(current_request, response_choice, current_turn)
            current_request: 'RolloutInferRequest' = ret['infer_request']
            current_turn += 1

        return rollout_outputs

    def check_finished(self, infer_request: 'RolloutInferRequest', response_choice: 'ChatCompletionResponseChoice',
                       current_turn: int) -> bool:

        last_query = infer_request.messages[-2]['content']
        # tips once
        if self.tips_prompt in last_query:
            return True

        completion = response_choice.message.content
        solution = infer_request.data_dict['solution']
        acc = self.acc_func([completion], [solution])[0]
        if acc == 1:
            return True

        return super().check_finished(infer_request, response_choice, current_turn)

    def step(self, infer_request: 'RolloutInferRequest', response_choice: 'ChatCompletionResponseChoice',
             current_turn: int) -> Dict:
        infer_request.messages.append({'role': 'user', 'content': self.tips_prompt})

        return {'infer_request': infer_request}

    def _is_thinking_template(self) -> bool:
        if not hasattr(self.infer_engine, 'template'):
            return False

        template = self.infer_engine.template
        return template.template_meta.is_thinking

    def _build_messages(self, original_messages: Messages) -> Messages:
        """
        Build history for a specific round, keeping only the think content from the last round.

        Args:
            original_messages: Original conversation messages

        Returns:
            Messages: History for this specific round
        """
        from copy import deepcopy

        # If this is a thinking template, use the template's method to prepare messages
        if self._is_thinking_template():
            # Create a mock inputs object to use the template's _swift_prepare_inputs method
            class MockInputs:

                def __init__(self, messages):
                    self.messages = deepcopy(messages)

            mock_inputs = MockInputs(original_messages)

            # Set up the template for inference mode
            template = self.infer_engine.template
            # _swift_prepare_inputs will remove historical thinking content when in train mode, patch the mode here
            original_mode = template.mode
            template.mode = 'train'
            # Use the template's method to prepare messages
            template._swift_prepare_inputs(mock_inputs)
            # Restore original mode
            template.mode = original_mode

            return mock_inputs.messages
        else:
            # Fallback to manual processing for non-thinking templates
            round_messages = []

            # Process messages in original order
            for i, msg in enumerate(original_messages):
                if msg['role'] == 'assistant' and isinstance(msg['content'], str) and i != len(original_messages) - 1:
                    # For assistant messages
                    assistant_no_think = msg['content'].split('</think>')[-1].strip()
                    round_messages.append(assistant_no_think)
                else:
                    round_messages.append(deepcopy(msg))

            return round_messages



# ====== end of ms-swift 4.6.0's ThinkingModelTipsScheduler ==================================================


# ====== ms-swift 4.6.0 (Apache-2.0), swift/rollout/multi_turn.py lines 738-836, verbatim but for one import ====
class MathTipsScheduler(MultiTurnScheduler):
    tips_prompt = 'But wait... It seems I made a mistake,'

    def __init__(self, *args, **kwargs):
        from rl_plugin_tips.accuracy import MathAccuracy
        super().__init__(*args, **kwargs)
        self.acc_func = kwargs.get('acc_function', MathAccuracy())
        # Cache the tokenized tips_prompt length for loss mask computation
        self._tips_token_ids = None

    def _get_tips_token_ids(self, tokenizer) -> List[int]:
        """Get tokenized tips_prompt (cached for efficiency)."""
        if self._tips_token_ids is None:
            # Tokenize without special tokens to get the raw token ids
            self._tips_token_ids = tokenizer.encode(self.tips_prompt, add_special_tokens=False)
        return self._tips_token_ids

    def check_finished(self, infer_request: 'RolloutInferRequest', response_choice: 'ChatCompletionResponseChoice',
                       current_turn: int) -> bool:
        last_completion = infer_request.messages[-1]['content']
        # we only give tips once
        if self.tips_prompt in last_completion:
            return True
        solution = infer_request.data_dict['solution']

        acc = self.acc_func([last_completion], [solution])[0]
        if acc == 1:
            return True

        return super().check_finished(infer_request, response_choice, current_turn)

    def step(self, infer_request: 'RolloutInferRequest', response_choice: 'ChatCompletionResponseChoice',
             current_turn: int) -> Dict:
        completion = response_choice.message.content
        response_token_ids = list(response_choice.token_ids) if response_choice.token_ids else []

        # Extract logprobs from response_choice before any truncation
        rollout_logprobs = self._extract_logprobs_from_choice(response_choice)

        # Truncate completion at <answer> or </think> tags
        truncate_idx = len(completion)
        if '<answer>' in completion:
            truncate_idx = min(truncate_idx, completion.index('<answer>'))
        if '</think>' in completion:
            truncate_idx = min(truncate_idx, completion.index('</think>'))

        if truncate_idx < len(completion):
            # Need to truncate token_ids and logprobs as well
            truncated_completion = completion[:truncate_idx]
            if response_token_ids and self.tokenizer is not None:
                # Find the token index corresponding to the truncation point
                # by decoding progressively until we reach or exceed the truncation point
                token_truncate_idx = len(response_token_ids)
                for i in range(1, len(response_token_ids) + 1):
                    decoded = self.tokenizer.decode(response_token_ids[:i], skip_special_tokens=False)
                    if len(decoded) >= truncate_idx:
                        token_truncate_idx = i
                        break
                response_token_ids = response_token_ids[:token_truncate_idx]
                # Truncate logprobs to match
                if rollout_logprobs:
                    rollout_logprobs = rollout_logprobs[:token_truncate_idx]
            completion = truncated_completion

        # Add tips_prompt
        completion += self.tips_prompt

        # Compute loss_mask for tips tokens
        # Note: rollout_logprobs should NOT include tips tokens because:
        # 1. Tips tokens have loss_mask=0, so their labels will be -100
        # 2. completion_mask = (labels != -100), so tips tokens won't be in completion_mask
        # 3. rollout_logprobs must align with completion_mask, not response_token_ids
        if response_token_ids and self.tokenizer is not None:
            tips_token_ids = self._get_tips_token_ids(self.tokenizer)
            # Loss mask: original tokens = 1, tips tokens = 0
            response_loss_mask = [1] * len(response_token_ids) + [0] * len(tips_token_ids)
            # Append tips token ids to response
            response_token_ids = response_token_ids + tips_token_ids
            # Do NOT extend rollout_logprobs for tips tokens - they are masked out in completion_mask
        else:
            response_loss_mask = []

        # Update messages
        if infer_request.messages[-1]['role'] == 'assistant':
            if not infer_request.messages[-1]['content']:
                # Multi-turn continuation: pop the dummy input we add in last turn
                infer_request.messages.pop(-1)
            infer_request.messages[-1]['content'] = completion
        else:
            infer_request.messages.append({'role': 'assistant', 'content': completion})

        result = {'infer_request': infer_request}
        if response_token_ids:
            result['response_token_ids'] = response_token_ids
            result['response_loss_mask'] = response_loss_mask
            if rollout_logprobs:
                result['rollout_logprobs'] = rollout_logprobs
        return result



# ====== end of ms-swift 4.6.0's MathTipsScheduler ===========================================================


# --- rlcore's code from here ------------------------------------------------------------------------------

PARAMS = SamplingParams(max_tokens=32)


def question(tok: Any) -> Prompt:
    msgs = [{"role": "user", "content": "what is 1 + 2?"}]
    return Prompt(msgs, encode_prompt(tok, msgs), data={"solution": "3"})


def answers(tok: Any, first: str, after_tip: str, tip: str) -> ScriptedSampler:
    """Says ``first``, and ``after_tip`` once the tip is in what it reads (any number of trajectories)."""

    def respond(prompt_ids: list[int], params: Any, i: int) -> str:
        return after_tip if tip in tok.decode(prompt_ids, skip_special_tokens=False) else first

    return ScriptedSampler(tokenizer=tok, respond=respond)


def sound(trajs: list[Trajectory], tok: Any) -> None:
    """rlcore's checker finds nothing and, independently, the tokens spell the final messages."""
    assert trajs and not check_batch(trajs, tok), check_batch(trajs, tok)
    for t in trajs:
        assert t.status in ("ok", "truncated"), t.reason
        text = tok.decode(t.input_ids, skip_special_tokens=False)
        want = tok.apply_chat_template(t.messages, tokenize=False)
        assert want.startswith(text) and want[len(text):] in ("\n", "<|im_end|>\n"), (text, want)


async def test_math_tips_cut_at_think_continues_token_exactly(tokenizer: Any) -> None:
    tip = MathTipsScheduler.tips_prompt
    s = answers(tokenizer, "<think>1 and 2 make 4</think><answer>4</answer>", " 3</think><answer>3</answer>", tip)
    sched = build_scheduler(MathTipsScheduler, s, tokenizer, max_turns=3)
    res = await run_rollouts(sched, [question(tokenizer)], num_generations=2, sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert t.messages[-1]["content"] == "<think>1 and 2 make 4" + tip + " 3</think><answer>3</answer>"
        tip_ids = tokenizer.encode(tip, add_special_tokens=False)
        untrained = [i for turn in t.turns for i, m in zip(turn.token_ids, turn.loss_mask) if not m]
        assert untrained == tip_ids and t.logprobs_complete and t.num_turns == 2
    sound(res.trajectories, tokenizer)


async def test_math_tips_right_first_time(tokenizer: Any) -> None:
    s = answers(tokenizer, "<think>1 and 2</think><answer>3</answer>", "never", MathTipsScheduler.tips_prompt)
    res = await run_rollouts(build_scheduler(MathTipsScheduler, s, tokenizer, max_turns=3), [question(tokenizer)],
                             sampling_params=PARAMS, progress=False)
    assert res.trajectories[0].num_turns == 1
    sound(res.trajectories, tokenizer)


async def test_math_tips_keeping_the_sampled_eos_fails_loudly(tokenizer: Any) -> None:
    """No ``</think>``/``<answer>`` to cut at: ms-swift keeps all sampled ids, eos included, then the tip."""
    s = answers(tokenizer, "it is 4", " 3", MathTipsScheduler.tips_prompt)
    res = await run_rollouts(build_scheduler(MathTipsScheduler, s, tokenizer, max_turns=3), [question(tokenizer)],
                             num_generations=2, sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert t.status == "failed"
        assert t.reason.startswith("invariant violated by scheduler MathTipsScheduler: tokens (turn 1)"), t.reason
        assert "4<|im_end|>But wait" in t.reason  # the tokens hold the eos, the message does not


async def test_thinking_tips_right_first_time(tokenizer: Any) -> None:
    s = answers(tokenizer, "<think>1 and 2</think><answer>3</answer>", "never", "The answer is not correct")
    res = await run_rollouts(build_scheduler(ThinkingModelTipsScheduler, s, tokenizer, max_turns=3), [question(tokenizer)],
                             sampling_params=PARAMS, progress=False)
    assert len(res.trajectories) == 1 and res.trajectories[0].messages[-1]["content"].startswith("<think>")
    sound(res.trajectories, tokenizer)


async def test_thinking_tips_later_rounds_fail_with_the_reason(tokenizer: Any) -> None:
    s = answers(tokenizer, "<think>a</think><answer>4</answer>", "<think>b</think><answer>3</answer>", "The answer is not correct")
    res = await run_rollouts(build_scheduler(ThinkingModelTipsScheduler, s, tokenizer, max_turns=3), [question(tokenizer)],
                             num_generations=2, sampling_params=PARAMS, progress=False)
    assert len(res.trajectories) == 4 and len({t.group_id for t in res.trajectories}) == 1
    first = [t for t in res.trajectories if t.status != "failed"]
    later = [t for t in res.trajectories if t.status == "failed"]
    assert len(first) == 2 and len(later) == 2
    for t in later:
        assert t.reason.startswith("scheduler ThinkingModelTipsScheduler returned an output rlcore cannot train on")
        assert "each message must be a dict" in t.reason
    sound(first, tokenizer)


@pytest.fixture(scope="module")
def hf_sampler(tiny_model_dir: str):
    from rlcore.sampling.hf import HFSampler

    s = HFSampler(tiny_model_dir, batch_window_ms=5, seed=0)
    yield s
    asyncio.run(s.close())


async def test_on_the_tiny_model(tokenizer: Any, hf_sampler: Any) -> None:
    """Random text: every trajectory is sound or fails with one of the reasons documented above."""
    params = SamplingParams(max_tokens=6, temperature=1.0)
    documented = ("invariant violated by scheduler MathTipsScheduler: tokens", "each message must be a dict")
    for cls in (MathTipsScheduler, ThinkingModelTipsScheduler):
        res = await run_rollouts(build_scheduler(cls, hf_sampler, tokenizer, max_turns=2), [question(tokenizer)] * 2,
                                 num_generations=3, sampling_params=params, progress=False)
        ok = [t for t in res.trajectories if t.status != "failed"]
        for t in res.trajectories:
            if t.status == "failed":
                assert any(d in t.reason for d in documented), t.reason
        assert ok
        sound(ok, tokenizer)
