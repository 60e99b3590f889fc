"""Conformance with ms-swift 4.x: its scheduler code runs on rlcore with only the imports changed.

ms-swift 4.0 moved the schedulers to ``swift/rollout/`` and gave ``RolloutScheduler`` helpers that
keep assistant messages as their exact token ids (``set_assistant_message_token_ids``,
``snapshot_and_materialize_assistant_messages``, ``append_assistant_completion``,
``get_response_token_data``, ``prepare_response_continuation`` …); its ``MultiTurnScheduler.run``
calls them, and so does any ``run`` a user copies from it to customise. This module holds two of
ms-swift 4.6.0's own class bodies, unchanged, as compatibility fixtures:

* ``CopiedRun.run`` — the body of ``MultiTurnScheduler.run`` (``swift/rollout/multi_turn.py``,
  ms-swift 4.6.0, lines 328-512), what a 4.x user who customises ``run`` starts from;
* ``GYMScheduler`` — the whole class (same file, lines 838-939), driven by real gymnasium
  environments registered in this module's ``envs`` dict, the way 4.x's ``gym_env.envs`` is.

Both are Copyright (c) ModelScope Contributors, Apache License 2.0
(https://github.com/modelscope/ms-swift/blob/main/LICENSE), kept verbatim so that the tests prove
drop-in compatibility; only the import lines above them differ from ms-swift's. The rest of this
module is rlcore's. Every trajectory is held to rlcore's invariant checker and to an independent
check of the token rule (``sound``), or fails with the reason rlcore documents
(docs/porting-ms-swift.md) where ms-swift's behaviour is what rlcore refuses.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from rlcore.rollout import build_scheduler, check_batch, encode_prompt, run_rollouts
from rlcore.testing import ScriptedSampler
from rlcore.types import Completion, Prompt, SamplingParams, Trajectory

# --- the import lines: ms-swift 4.6.0's, changed to rlcore's -----------------------------------------
# ms-swift: import asyncio / from copy import deepcopy / from typing import Any, Dict, List, Optional, Union
# ms-swift: from swift.rollout import Env, MultiTurnScheduler   (swift/rollout/gym_env.py, multi_turn.py)
# ms-swift: from swift.infer_engine.protocol import RolloutOutput
# ms-swift: from swift.template import Messages
# ms-swift: from swift.utils import remove_response
from copy import deepcopy  # noqa: E402
from typing import Dict, List, Optional, Union  # noqa: E402,F401

from rlcore import Env, Messages, MultiTurnScheduler  # noqa: E402,F401
from rlcore.rollout import RolloutOutput, remove_response  # noqa: E402

PARAMS = SamplingParams(max_tokens=24)


# ====== ms-swift 4.6.0 (Apache-2.0), swift/rollout/multi_turn.py lines 328-512, verbatim =====================
class CopiedRun(MultiTurnScheduler):

    async def run(self, infer_request: 'RolloutInferRequest', request_config: 'RequestConfig',
                  **kwargs) -> Union['RolloutOutput', List['RolloutOutput']]:
        """Execute multi-turn conversation rollout with built-in turn management logic.

        This implements the default multi-turn interaction flow that can be overridden
        to customize conversation handling behavior. The default logic provides:

        1. Automatic conversation turn management and stopping conditions
        2. Seamless message accumulation across multiple turns
        3. Response token tracking and loss mask management
        4. Configurable early stopping mechanisms

        Args:
            infer_request: The initial inference request containing conversation messages
            request_config: Configuration parameters for the inference request
            **kwargs: Additional inference parameters passed to the engine

        Returns:
            RolloutOutput containing the complete conversation history and metadata,
            or a list of outputs for batched requests

        Customization Approaches:
            - Override check_finished() to implement custom stopping criteria
            - Override step() to customize turn-to-turn transition logic
            - Override this entire run() method for completely custom multi-turn behavior

        Important Notes:
            - Method overriding is only supported when using server mode (swift rollout)
              with vllm_use_async_engine=True
            - Custom implementations must maintain async/await compatibility
            - Ensure proper handling of conversation state across turns

        Example:
            class CustomScheduler(MultiTurnScheduler):
                async def run(self, infer_request, request_config, **kwargs):
                    # Implement custom multi-turn conversation logic
                    # Must return RolloutOutput or List[RolloutOutput]
                    ...
        """
        current_request = infer_request
        await self.on_trajectory_start([current_request])
        current_turn = 1
        rollout_infos = {}
        total_response_ids = []
        total_response_loss_mask = []
        total_rollout_logprobs = []
        while True:
            messages = current_request.messages
            if current_turn == 1:
                # If it's the first turn, remove the response
                # Keep the original logic, but I think this step is unnecessary here.
                remove_response(messages)

            # Get model response
            response: 'ChatCompletionResponse' = await self.infer_engine.infer_async(
                current_request, request_config, **kwargs)
            response_choice: 'ChatCompletionResponseChoice' = response.choices[0]

            if current_turn > 1 and not messages[-1]['content']:
                # The dummy assistant message was intentionally kept during `infer_async`
                # to ensure correct history processing by the template.
                # It is now removed before appending the new completion.
                # otherwise, a syntax error would occur when executing messages[-1]['content'] += completion.
                remove_response(messages)

            # Update conversation history
            completion = response_choice.message.content
            is_continuation = self.append_assistant_completion(current_request, completion)

            # Check stopping conditions
            assistant_snapshots = self.snapshot_and_materialize_assistant_messages(current_request)
            try:
                turn_result = await self.on_turn_end(current_request, response_choice, current_turn)
                if turn_result.get('rollout_infos'):
                    rollout_infos.update(turn_result['rollout_infos'])
                should_stop = self.check_finished(current_request, response_choice, current_turn)
                if 'done' in turn_result:
                    should_stop = turn_result['done']
            finally:
                self.restore_assistant_message_snapshots(assistant_snapshots)

            # double-check if user forget to judge the max_turns
            if self.max_turns:
                should_stop = should_stop or (current_turn >= self.max_turns)

            if should_stop:
                # Collect final turn's data
                current_logprobs = self._extract_logprobs_from_choice(response_choice)
                final_token_ids, final_loss_mask = self.get_response_token_data(
                    current_request, response_choice, is_continuation=is_continuation)

                if is_continuation and total_response_ids:
                    # For continuation, extend the last turn's data
                    total_response_ids[-1].extend(final_token_ids)
                    if total_response_loss_mask:
                        total_response_loss_mask[-1].extend(final_loss_mask)
                    if total_rollout_logprobs and current_logprobs:
                        total_rollout_logprobs[-1].extend(current_logprobs)
                else:
                    # Start a new assistant turn, including the first-turn-immediate-stop case.
                    if final_token_ids:
                        total_response_ids.append(list(final_token_ids))
                        total_response_loss_mask.append(final_loss_mask)
                    if current_logprobs:
                        total_rollout_logprobs.append(current_logprobs)

                # Validate rollout_logprobs completeness: if logprobs are incomplete (missing for some turns),
                # clear them to disable rollout importance sampling correction (which requires complete logprobs)
                # Note: rollout_logprobs should match the number of loss_mask=1 tokens, not total response tokens
                # because completion_mask in grpo_trainer is based on labels != -100, which corresponds to loss_mask=1
                final_rollout_logprobs = total_rollout_logprobs
                if total_rollout_logprobs:
                    total_logprob_count = sum(len(turn_lps) for turn_lps in total_rollout_logprobs)
                    if total_response_loss_mask:
                        # Check if the number of logprobs matches the number of loss_mask=1 tokens
                        total_loss_mask_1_count = sum(sum(mask) for mask in total_response_loss_mask)
                        if total_loss_mask_1_count != total_logprob_count:
                            # Incomplete logprobs, clear them
                            final_rollout_logprobs = []
                    else:
                        if total_response_ids:
                            total_response_id_count = sum(len(turn_ids) for turn_ids in total_response_ids)
                            if total_response_id_count != total_logprob_count:
                                final_rollout_logprobs = []
                        else:
                            final_rollout_logprobs = []

                return RolloutOutput(
                    response=response,
                    messages=messages,
                    response_token_ids=total_response_ids,
                    response_loss_mask=total_response_loss_mask,
                    rollout_infos={
                        **rollout_infos, 'num_turns': current_turn
                    },
                    rollout_logprobs=final_rollout_logprobs,
                )

            # Prepare next turn
            response_ids, response_mask = self.get_response_token_data(
                current_request, response_choice, is_continuation=is_continuation)
            ret = self.step(current_request, response_choice, current_turn)
            ret.setdefault('response_token_ids', response_ids)
            ret.setdefault('response_loss_mask', response_mask)
            current_request: 'RolloutInferRequest' = ret['infer_request']

            # Track response tokens and masks
            return_token_id = False
            if 'response_token_ids' in ret:
                if is_continuation and total_response_ids:
                    total_response_ids[-1].extend(ret['response_token_ids'])
                else:
                    total_response_ids.append(ret['response_token_ids'])
                return_token_id = True

            if 'response_loss_mask' in ret:
                assert return_token_id, 'You must return response_token_ids if you want to return response_loss_mask'
                assert len(ret['response_loss_mask']) == len(ret['response_token_ids']), \
                    'response_loss_mask must have the same length as response_token_ids'
                if is_continuation and total_response_loss_mask:
                    total_response_loss_mask[-1].extend(ret['response_loss_mask'])
                else:
                    total_response_loss_mask.append(ret['response_loss_mask'])

            if 'rollout_infos' in ret:
                # Always overwrite the rollout info for this step.
                # If you need to keep all step-wise details, switch to append or merge instead.
                rollout_infos.update(ret['rollout_infos'])

            # Track rollout_logprobs for rollout importance sampling correction
            # Prefer step's returned logprobs (which may be modified/truncated) over raw response_choice logprobs
            if 'rollout_logprobs' in ret and ret['rollout_logprobs']:
                current_logprobs = ret['rollout_logprobs']
            else:
                current_logprobs = self._extract_logprobs_from_choice(response_choice)
            if current_logprobs:
                if is_continuation and total_rollout_logprobs:
                    total_rollout_logprobs[-1].extend(current_logprobs)
                else:
                    total_rollout_logprobs.append(current_logprobs)

            if total_response_ids:
                self.set_assistant_message_token_ids(current_request, total_response_ids[-1])

            current_turn += 1


# ====== end of ms-swift 4.6.0's MultiTurnScheduler.run =====================================================


# ====== ms-swift 4.6.0 (Apache-2.0), swift/rollout/multi_turn.py lines 838-939, verbatim =====================
class GYMScheduler(MultiTurnScheduler):
    """Gym environment-driven scheduler using universal hooks.

    Implements ``on_trajectory_start`` (env.reset) and ``on_turn_end`` (env.step)
    to integrate gym environments into the multi-turn protocol. Works in both
    server mode (``run()``) and colocate mode (``run_multi_turn()``).
    """

    def __init__(self, infer_engine: Optional['GRPOVllmEngine'] = None, max_turns: Optional[int] = None, **kwargs):
        super().__init__(infer_engine, max_turns, **kwargs)
        self.gym_env_name = kwargs.get('gym_env', None)
        # Per-trajectory state (keyed by uuid)
        self._envs: Dict[str, Env] = {}
        self._total_rewards: Dict[str, float] = {}
        self._step_rewards: Dict[str, List[float]] = {}
        self._pending_obs: Dict[str, Optional[str]] = {}

    async def _close_and_remove(self, uuid: str) -> None:
        """Close env for a given uuid and remove all associated state."""
        env = self._envs.pop(uuid, None)
        if env is not None:
            try:
                await env.close()
            except Exception:
                pass
        self._total_rewards.pop(uuid, None)
        self._step_rewards.pop(uuid, None)
        self._pending_obs.pop(uuid, None)

    # ------------------------------------------------------------------
    # Universal async hooks (called by both run() and run_multi_turn())
    # ------------------------------------------------------------------
    async def on_trajectory_start(self, requests: List['RolloutInferRequest']) -> None:
        """Create one env per request and seed messages with initial observation."""

        async def _init_single(req: 'RolloutInferRequest') -> None:
            uuid = req.uuid
            if uuid in self._envs:
                await self._close_and_remove(uuid)

            env_config = (req.data_dict or {}).get('env_config', {}) if hasattr(req, 'data_dict') else {}
            env = self._create_env(env_config)
            observation, info, system_message = await env.reset(req)

            messages: Messages = []
            if system_message:
                messages.append({'role': 'system', 'content': system_message})
            messages.append({'role': 'user', 'content': observation})
            req.messages = messages

            self._envs[uuid] = env
            self._total_rewards[uuid] = 0.0
            self._step_rewards[uuid] = []
            self._pending_obs[uuid] = None

        await asyncio.gather(*[_init_single(req) for req in requests])

    async def on_turn_end(self, infer_request: 'RolloutInferRequest', response_choice: 'ChatCompletionResponseChoice',
                          current_turn: int) -> Dict[str, Any]:
        """Advance the gym env, accumulate reward, and return done + rollout_infos."""
        uuid = infer_request.uuid
        env = self._envs.get(uuid)
        if env is None:
            return {'done': True, 'rollout_infos': {}}

        next_obs, reward, done, info = await env.step(deepcopy(infer_request.messages))
        self._total_rewards[uuid] = self._total_rewards.get(uuid, 0.0) + float(reward)
        self._step_rewards.setdefault(uuid, []).append(float(reward))

        self._pending_obs[uuid] = None if done else next_obs

        rollout_infos: Dict[str, Any] = {
            'total_reward': self._total_rewards[uuid],
            'step_rewards': list(self._step_rewards.get(uuid, [])),
            'gym_done': done,
        }
        if done:
            await self._close_and_remove(uuid)

        return {'done': done, 'rollout_infos': rollout_infos}

    # ------------------------------------------------------------------
    # Step hook (injects next observation for the next turn)
    # ------------------------------------------------------------------
    def step(self, infer_request: 'RolloutInferRequest', response_choice: 'ChatCompletionResponseChoice',
             current_turn: int) -> Dict[str, Any]:
        uuid = infer_request.uuid
        next_obs = self._pending_obs.get(uuid)
        if next_obs is not None:
            infer_request.messages.append({'role': 'user', 'content': next_obs})
            self._pending_obs[uuid] = None
        return {'infer_request': infer_request}

    # ------------------------------------------------------------------
    # Env helpers
    # ------------------------------------------------------------------
    def _create_env(self, env_config: Dict) -> Env:
        env_name = env_config.get('name', self.gym_env_name)
        if env_name not in envs:
            raise ValueError(f"Environment '{env_name}' not found. Available: {list(envs.keys())}")
        return envs[env_name](env_config)



# ====== end of ms-swift 4.6.0's GYMScheduler ===============================================================


# --- rlcore's code from here: environments, schedulers built on the fixtures, the checks -------------------

#: ChatML whose earlier assistant messages lose their <think> block, as Qwen3-style templates do
THINK_DROPPING_TEMPLATE = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for message in messages %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip() %}{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ content }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

MOVES = ("LEFT", "DOWN", "RIGHT", "UP")
#: the shortest way over gymnasium's default 4x4 FrozenLake map (is_slippery=False)
SAFE_PATH = ["RIGHT", "RIGHT", "DOWN", "DOWN", "DOWN", "RIGHT"]


class FrozenLakeEnv(Env):
    """ms-swift 4.6.0's ``Env`` shape (``Env(env_config)``; async ``reset(request) -> (obs, info,
    system)``, ``step(messages) -> (obs, reward, done, info)``, ``close``) around a real
    ``gymnasium.make("FrozenLake-v1")``."""

    resets = 0
    closes = 0

    async def reset(self, config):
        import gymnasium

        type(self).resets += 1
        self.env = gymnasium.make("FrozenLake-v1", is_slippery=False)
        self.state, _ = self.env.reset(seed=int(self.env_config.get("seed", 0)))
        return f"You stand on cell {self.state} of a 4x4 lake. Say LEFT, DOWN, RIGHT or UP.", {"state": self.state}, "You cross a frozen lake."

    async def step(self, action):
        said = str(action[-1]["content"]).upper()
        move = next((i for i, name in enumerate(MOVES) if name in said), None)
        if move is None:
            return "Say one of LEFT, DOWN, RIGHT, UP.", 0.0, False, {"invalid": True}
        self.state, reward, terminated, truncated, _ = self.env.step(move)
        return f"You stand on cell {self.state}.", float(reward), bool(terminated or truncated), {"state": int(self.state)}

    async def close(self):
        type(self).closes += 1
        self.env.close()


envs = {"frozen_lake": FrozenLakeEnv}


class AskAgain(CopiedRun):
    """A 4.x user's scheduler: ms-swift's base ``run`` (copied) with its own ``step``/``check_finished``."""

    def check_finished(self, infer_request, response_choice, current_turn):
        if "yes" in response_choice.message.content:
            return True
        return super().check_finished(infer_request, response_choice, current_turn)

    def step(self, infer_request, response_choice, current_turn):
        infer_request.messages.append({"role": "user", "content": f"turn {current_turn} done, again"})
        return {"infer_request": infer_request}


class TipAfterSample(CopiedRun):
    """A 4.x user's continuation scheduler: ``step`` appends a tip after the sampled tokens with
    ``prepare_response_continuation`` (rlcore's drops the sampled eos) and ms-swift's base ``run``
    freezes the message as those ids (``set_assistant_message_token_ids``)."""

    tip = " But wait, let me check."

    def check_finished(self, infer_request, response_choice, current_turn):
        if current_turn > 1:
            return True
        return super().check_finished(infer_request, response_choice, current_turn)

    def step(self, infer_request, response_choice, current_turn):
        ids, mask, lps = self.prepare_response_continuation(response_choice)
        tip_ids = self.tokenizer.encode(self.tip, add_special_tokens=False)
        infer_request.messages[-1]["content"] = self.tokenizer.decode(ids + tip_ids, skip_special_tokens=False)
        return {"infer_request": infer_request, "response_token_ids": ids + tip_ids,
                "response_loss_mask": mask + [0] * len(tip_ids), "rollout_logprobs": lps}


class TipKeepingEos(TipAfterSample):
    """What ms-swift 4.6.0's own ``prepare_response_continuation`` returns: the sampled eos kept."""

    def step(self, infer_request, response_choice, current_turn):
        ids = list(response_choice.token_ids)
        tip_ids = self.tokenizer.encode(self.tip, add_special_tokens=False)
        return {"infer_request": infer_request, "response_token_ids": ids + tip_ids,
                "response_loss_mask": [1] * len(ids) + [0] * len(tip_ids)}


class GymWithCopiedRun(CopiedRun, GYMScheduler):
    """GYMScheduler's hooks under ms-swift's base ``run``, which calls ``on_trajectory_start`` itself."""


# --- checks ------------------------------------------------------------------------------------------------


class Recording:
    """A sampler wrapper that keeps every completion, to check trained logprobs against them."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.completions: list[Completion] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        c = await self.inner.generate(prompt_ids, params)
        self.completions.append(copy.deepcopy(c))
        return c

    async def close(self) -> None:
        pass


def sound(trajs: list[Trajectory], tok: Any, sampler: Recording | None = None) -> None:
    """rlcore's checker finds nothing, and, independently: tokens spell the final messages (text,
    never ids), trained tokens carry the logprobs the sampler reported for them."""
    assert not check_batch(trajs, tok), check_batch(trajs, tok)
    for t in trajs:
        assert t.status in ("ok", "truncated"), (t.status, t.reason)
        assert all(isinstance(m["content"], str) for m in t.messages), t.messages
        ids = list(t.prompt_ids)
        for turn in t.turns:  # a custom special stop token ends a message like the eos but is not its text
            drop = (any(turn.loss_mask) and turn.finish_reason == "stop" and turn.token_ids
                    and turn.token_ids[-1] in tok.all_special_ids and turn.token_ids[-1] != tok.eos_token_id)
            ids += turn.token_ids[:-1] if drop else turn.token_ids
        text = tok.decode(ids, skip_special_tokens=False)
        want = tok.apply_chat_template(t.messages, tokenize=False, add_generation_prompt=t.messages[-1]["role"] != "assistant")
        # the closing after the last reply is the template's unless the model emitted it (its eos)
        tails = ("", "\n", "<|im_end|>\n") if t.messages[-1]["role"] == "assistant" else ("",)
        assert want.startswith(text) and want[len(text):] in tails, (text, want)
        if sampler is not None:
            for run in _trained_runs(t):
                assert any(_holds(c, run) for c in sampler.completions), "trained tokens the sampler never produced"


def _trained_runs(t: Trajectory) -> list[list[tuple[int, float]]]:
    """Each maximal run of loss-mask-1 tokens (with logprobs) inside one turn."""
    runs: list[list[tuple[int, float]]] = []
    for turn in t.turns:
        cur: list[tuple[int, float]] = []
        for i, m, lp in zip(turn.token_ids, turn.loss_mask, turn.logprobs):
            if m:
                cur.append((i, lp))
            elif cur:
                runs.append(cur)
                cur = []
        if cur:
            runs.append(cur)
    return runs


def _holds(c: Completion, run: list[tuple[int, float]]) -> bool:
    ids = [i for i, _ in run]
    for s in range(len(c.token_ids) - len(ids) + 1):
        if c.token_ids[s:s + len(ids)] == ids:
            return all(abs(c.logprobs[s + k] - lp) < 1e-6 for k, (_, lp) in enumerate(run))
    return False


@pytest.fixture(scope="module")
def tok(tiny_model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def scripted(tok: Any, texts: list[str]) -> Recording:
    return Recording(ScriptedSampler(texts, tok))


def questions(tok: Any, n: int = 2) -> list[Prompt]:
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"what is {i} + 3?"}]
        out.append(Prompt(msgs, encode_prompt(tok, msgs), data={"solution": str(i + 3), "env_config": {"name": "frozen_lake", "seed": i}}))
    return out


# --- ms-swift 4.6.0's base run, copied by a user ------------------------------------------------------------


async def test_copied_base_run_with_new_user_messages(tok: Any) -> None:
    s = scripted(tok, ["no", "still no", "yes 3"])
    res = await run_rollouts(AskAgain(s, max_turns=5), questions(tok), sampling_params=PARAMS, progress=False)
    for t in res.trajectories:  # each answer its own round: trained, with the user turns untrained between
        assert t.num_turns == 3 and [m["role"] for m in t.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
        assert [m["content"] for m in t.messages if m["role"] == "assistant"] == ["no", "still no", "yes 3"]
        assert sum(1 for turn in t.turns if any(turn.loss_mask)) == 3 and t.logprobs_complete
    sound(res.trajectories, tok, s)


async def test_copied_base_run_continuation_after_the_sampled_tokens(tok: Any) -> None:
    s = scripted(tok, ["so it is 4", " no, 3"])
    res = await run_rollouts(TipAfterSample(s, max_turns=3), questions(tok), sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert t.messages[-1] == {"role": "assistant", "content": "so it is 4" + TipAfterSample.tip + " no, 3"}
        first, tip = (tok.encode(x, add_special_tokens=False) for x in ("so it is 4", TipAfterSample.tip))
        second = tok.encode(" no, 3", add_special_tokens=False) + [tok.eos_token_id]
        assert t.completion_ids == first + tip + second  # the first sample's eos left out
        assert t.loss_mask == [1] * len(first) + [0] * len(tip) + [1] * len(second)
    sound(res.trajectories, tok, s)


async def test_copied_base_run_keeping_the_eos_fails_loudly(tok: Any) -> None:
    """ms-swift 4.6.0 re-sends the message with the sampled eos inside and continues after it."""
    s = scripted(tok, ["so it is 4", " no, 3"])
    res = await run_rollouts(TipKeepingEos(s, max_turns=3), questions(tok), sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert t.status == "failed"
        assert t.reason.startswith("scheduler TipKeepingEos turn 1: MessagesEditError: token-backed assistant message 1 holds the closing token '<|im_end|>'"), t.reason


async def test_copied_base_run_on_a_template_that_drops_thinking(tok: Any) -> None:
    """ms-swift 4.x keeps the history as token ids, so a template that drops earlier ``<think>``
    blocks (Qwen3's) never re-renders them; rlcore holds every trajectory to the template's
    rendering of its final messages, which no longer shows them: the trajectory fails at that turn
    with the ChatTemplateError reason docs/porting-ms-swift.md gives (one output per round is the
    shape that works there)."""
    dropping = copy.deepcopy(tok)
    dropping.chat_template = THINK_DROPPING_TEMPLATE
    s = scripted(dropping, ["<think>hmm</think>no", "yes"])
    res = await run_rollouts(AskAgain(s, max_turns=3), questions(dropping, 1), sampling_params=PARAMS, progress=False)
    t = res.trajectories[0]
    assert t.status == "failed" and t.reason.startswith("scheduler AskAgain turn 1: ChatTemplateError"), t.reason
    s = scripted(dropping, ["no", "yes"])  # without thinking in the history the same run is sound
    res = await run_rollouts(AskAgain(s, max_turns=3), questions(dropping, 1), sampling_params=PARAMS, progress=False)
    sound(res.trajectories, dropping, s)


async def test_ids_that_are_not_the_answer_fail_loudly(tok: Any) -> None:
    class Rewrites(AskAgain):
        def step(self, infer_request, response_choice, current_turn):
            out = super().step(infer_request, response_choice, current_turn)
            if current_turn == 2:  # rewrite the first answer, already in the token stream
                infer_request.messages[1]["content"] = self.tokenizer.encode("maybe", add_special_tokens=False)
            return out

    s = scripted(tok, ["no", "still no", "yes 3"])
    res = await run_rollouts(Rewrites(s, max_turns=5), questions(tok, 1), sampling_params=PARAMS, progress=False)
    t = res.trajectories[0]
    assert t.status == "failed" and "token-backed assistant message 1 was set to" in t.reason, t.reason


# --- GYMScheduler (verbatim) on real gymnasium environments -------------------------------------------------


async def test_gym_scheduler_reaches_the_goal(tok: Any) -> None:
    FrozenLakeEnv.resets = FrozenLakeEnv.closes = 0
    s = scripted(tok, SAFE_PATH)
    sched = build_scheduler(GYMScheduler, s, tok, max_turns=8)
    res = await run_rollouts(sched, questions(tok, 1), sampling_params=PARAMS, progress=False)
    t = res.trajectories[0]
    assert t.messages[0] == {"role": "system", "content": "You cross a frozen lake."}
    assert t.num_turns == 6 and t.step_rewards == [0.0] * 5 + [1.0] and t.infos["total_reward"] == 1.0
    assert t.infos["gym_done"] is True and t.infos["prompt_messages"] == 2
    assert FrozenLakeEnv.resets == 1 and FrozenLakeEnv.closes == 1
    sound(res.trajectories, tok, s)


async def test_gym_scheduler_invalid_moves_and_holes(tok: Any) -> None:
    s = scripted(tok, ["I will go DOWN", "jump", "RIGHT"])  # cell 4, invalid, cell 5 is a hole
    res = await run_rollouts(build_scheduler(GYMScheduler, s, tok, max_turns=8), questions(tok, 1), sampling_params=PARAMS, progress=False)
    t = res.trajectories[0]
    assert t.num_turns == 3 and t.step_rewards == [0.0, 0.0, 0.0] and t.infos["gym_done"] is True
    assert "Say one of LEFT" in t.messages[-2]["content"]
    sound(res.trajectories, tok, s)


async def test_gym_hooks_under_the_copied_run_reset_once(tok: Any) -> None:
    """ms-swift's base run calls on_trajectory_start itself; rlcore's driver already did: once only."""
    FrozenLakeEnv.resets = 0
    s = scripted(tok, SAFE_PATH)
    res = await run_rollouts(build_scheduler(GymWithCopiedRun, s, tok, max_turns=8), questions(tok, 2),
                             sampling_params=PARAMS, progress=False)
    assert FrozenLakeEnv.resets == 2
    for t in res.trajectories:
        assert t.infos["total_reward"] == 1.0 and t.step_rewards[-1] == 1.0 and t.num_turns == 6
    sound(res.trajectories, tok, s)


# --- token-backed messages in rlcore's own loop, and text that hides the eos -------------------------------


class TipByIds(MultiTurnScheduler):
    """A 4.x-style ``step`` on rlcore's loop that edits the reply by setting its token ids."""

    tip = " But wait, let me check."

    def check_finished(self, infer_request, response_choice, current_turn):
        return current_turn > 1 or super().check_finished(infer_request, response_choice, current_turn)

    def step(self, infer_request, response_choice, current_turn):
        ids, _, _ = self.prepare_response_continuation(response_choice)
        self.set_assistant_message_token_ids(infer_request, ids + self.tokenizer.encode(self.tip, add_special_tokens=False))
        return {"infer_request": infer_request}


async def test_ids_set_by_step_on_rlcore_loop(tok: Any) -> None:
    s = scripted(tok, ["so it is 4", " no, 3"])
    res = await run_rollouts(TipByIds(s, max_turns=3), questions(tok), sampling_params=PARAMS, progress=False)
    first, tip = (tok.encode(x, add_special_tokens=False) for x in ("so it is 4", TipByIds.tip))
    second = tok.encode(" no, 3", add_special_tokens=False) + [tok.eos_token_id]
    for t in res.trajectories:
        assert t.messages[-1] == {"role": "assistant", "content": "so it is 4" + TipByIds.tip + " no, 3"}
        assert t.completion_ids == first + tip + second and t.infos["token_backed_edits"] == 1
        assert t.loss_mask == [1] * len(first) + [0] * len(tip) + [1] * len(second)
    sound(res.trajectories, tok, s)


async def test_text_holding_the_eos_is_refused(tok: Any) -> None:
    """ms-swift 4.x decodes ids with the special tokens kept: tokens and text then agree, yet the
    model would be trained on its eos in the middle of a message."""

    class DecodesTheEos(MultiTurnScheduler):
        async def run(self, infer_request, request_config, **kwargs):
            response = await self.infer_engine.infer_async(infer_request, request_config)
            sampled = list(response.choices[0].token_ids)
            more = self.tokenizer.encode(" wait", add_special_tokens=False)
            text = self.tokenizer.decode(sampled + more, skip_special_tokens=False)
            return RolloutOutput(response=response, messages=infer_request.messages + [{"role": "assistant", "content": text}],
                                 response_token_ids=[sampled + more], response_loss_mask=[[1] * len(sampled) + [0] * len(more)])

    res = await run_rollouts(DecodesTheEos(scripted(tok, ["four"])), questions(tok, 1), sampling_params=PARAMS, progress=False)
    t = res.trajectories[0]
    assert t.status == "failed" and "assistant message 1 holds the closing token '<|im_end|>' inside its text" in t.reason, t.reason


# --- the helpers, one by one ---------------------------------------------------------------------------------


def test_helpers_follow_ms_swift(tok: Any) -> None:
    sched = MultiTurnScheduler(tokenizer=tok)
    eos = tok.eos_token_id
    ids = tok.encode("it is 4", add_special_tokens=False)
    c = Completion(ids + [eos], [-0.5] * (len(ids) + 1), "stop", text="it is 4")
    from rlcore.rollout import ResponseChoice

    choice = ResponseChoice(c, tok)
    assert sched.get_response_token_data(None, choice) == (ids + [eos], [1] * (len(ids) + 1))
    assert sched.get_response_token_data(None, choice, response_token_ids=[1, 2], response_loss_mask=[1, 0]) == ([1, 2], [1, 0])
    from rlcore.errors import ConfigError

    with pytest.raises(ConfigError, match="3 values for 2"):
        sched.get_response_token_data(None, choice, response_token_ids=[1, 2], response_loss_mask=[1, 0, 1])
    assert sched.prepare_response_continuation(choice) == (ids, [1] * len(ids), [-0.5] * len(ids))
    req = Trajectory([], messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "x"}])
    sched.set_assistant_message_token_ids(req, ids + [eos])
    assert req.messages[1]["content"] == ids + [eos]
    snaps = sched.snapshot_and_materialize_assistant_messages(req)
    assert req.messages[1]["content"] == "it is 4"
    sched.restore_assistant_message_snapshots(snaps)
    assert req.messages[1]["content"] == ids + [eos]
    req.messages[1]["content"] = {"token_ids": ids}
    assert sched.append_assistant_completion(req, ", so") is True and req.messages[1]["content"] == "it is 4, so"
    assert sched.append_assistant_completion(Trajectory([], messages=[{"role": "user", "content": "q"}]), "a") is False
    assert sched.engine is sched.infer_engine or sched.engine.scheduler is sched


async def test_base_hooks_are_awaitable_for_4x_subclasses(tok: Any) -> None:
    class Awaits(MultiTurnScheduler):
        async def on_trajectory_start(self, requests):
            await super().on_trajectory_start(requests)
            for r in requests:
                r.infos["started"] = True

        async def on_turn_end(self, infer_request, response_choice, current_turn):
            result = await super().on_turn_end(infer_request, response_choice, current_turn)
            return {**result, "rollout_infos": {"seen": current_turn}}

    s = scripted(tok, ["yes"])
    res = await run_rollouts(Awaits(s, max_turns=1), questions(tok, 1), sampling_params=PARAMS, progress=False)
    t = res.trajectories[0]
    assert t.status == "ok" and t.infos["started"] and t.infos["seen"] == 1
    sound(res.trajectories, tok, s)


# --- on the real tiny model ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_sampler(tiny_model_dir: str):
    from rlcore.sampling.hf import HFSampler

    s = HFSampler(tiny_model_dir, batch_window_ms=5, seed=0)
    yield s
    asyncio.run(s.close())


async def test_on_the_tiny_model(tok: Any, hf_sampler: Any) -> None:
    """Whatever the random tiny model says, the 4.x fixtures' trajectories are sound."""
    s = Recording(hf_sampler)
    params = SamplingParams(max_tokens=8, temperature=1.0, stop_token_ids=list(range(0, 1024, 7)))
    for cls in (AskAgain, TipAfterSample, GYMScheduler, GymWithCopiedRun):
        sched = build_scheduler(cls, s, tok, max_turns=3)
        res = await run_rollouts(sched, questions(tok, 2), num_generations=2, sampling_params=params, progress=False)
        ok = [t for t in res.trajectories if t.status != "failed"]
        assert ok and len(ok) == len(res.trajectories), [t.reason for t in res.trajectories]
        sound(ok, tok, s)
