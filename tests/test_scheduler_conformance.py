"""Conformance: schedulers written against ms-swift's documented scheduler API run on rlcore, and
every trajectory they produce trains on exactly the conversation they report.

The schedulers below are our own code, written in the style of ms-swift 3.12.6's
``swift/plugin/multi_turn.py`` (``MultiTurnScheduler``/``RolloutScheduler`` subclasses, ``step`` /
``check_finished`` / ``run(infer_request, request_config, **kwargs)`` returning ``RolloutOutput``,
``self._extract_logprobs_from_choice``), its ``swift/plugin/env.py`` ``Env`` (``Env(env_config)``,
``reset(request) -> (obs, info, system)``, ``step(messages) -> (obs, reward, done, info)``) and its
``RolloutOutput`` (``swift/llm/infer/protocol.py``: per-round ``response_token_ids``). Only the import
lines differ from what one would write for ms-swift.

Each one runs on two real tokenizers — the tiny ChatML one, and the same vocabulary with a template
that is NOT prefix-preserving (earlier assistant turns lose their ``<think>`` block, as Qwen3's do)
— with a scripted sampler, and on the real tiny model. The rule checked for every trajectory, with
code independent of rlcore's checker (``assert_sound``):

* detokenised ``prompt_ids`` == the rendering (with generation prompt) of the prompt messages;
* detokenised ``prompt_ids + completion_ids`` == the rendering of the final messages (trained
  assistant contents as sampled), up to a closing the model did not emit;
* every loss-mask-1 token carries the logprob the sampler reported for it;
* status is ``truncated`` when the last completion was cut by length, uuids are unique.
"""

from __future__ import annotations

import asyncio
import copy
import re
from typing import Any

import pytest

from rlcore import Env, Messages, MultiTurnScheduler, RolloutOutput, RolloutScheduler
from rlcore.rollout import encode_prompt, run_rollouts
from rlcore.rollout.options import plugin_options
from rlcore.rollout.scheduler import build_scheduler
from rlcore.sampling.base import Sampler
from rlcore.chat_template import set_multi_turn_mode
from rlcore.rollout import check_batch
from rlcore.testing import THINK_DROPPING_TEMPLATE, ScriptedSampler
from rlcore.testing.multi_turn import RecordingSampler, assert_rows_are_sampler_calls
from rlcore.types import Completion, Prompt, SamplingParams, Trajectory

PARAMS = SamplingParams(max_tokens=24)

# --- tokenizers ---------------------------------------------------------------------------------------



@pytest.fixture(scope="module")
def chatml(tiny_model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def think_dropping(chatml: Any) -> Any:
    tok = copy.deepcopy(chatml)
    tok.chat_template = THINK_DROPPING_TEMPLATE
    return tok


@pytest.fixture(params=["chatml", "think_dropping"])
def tok(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(request.param)


def is_prefix_preserving(tok: Any) -> bool:
    return tok.chat_template != THINK_DROPPING_TEMPLATE


# --- samplers -----------------------------------------------------------------------------------------


class Recording(Sampler):
    """Wraps a sampler and keeps every completion, to check trained logprobs against them."""

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


def scripted(tok: Any, texts: list[str], **kw: Any) -> Recording:
    return Recording(ScriptedSampler(texts, tok, **kw))


@pytest.fixture(scope="module")
def hf_sampler(tiny_model_dir: str):
    from rlcore.sampling.hf.sampler import HFSampler

    s = HFSampler(tiny_model_dir, batch_window_ms=5, seed=0)
    yield s
    asyncio.run(s.close())


# --- the rule, checked independently of rlcore's checker -----------------------------------------------


def render(tok: Any, messages: list[dict[str, Any]], gen: bool) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)


def assert_sound(trajs: list[Trajectory], tok: Any, sampler: Recording | None = None) -> None:
    assert len({t.uuid for t in trajs}) == len(trajs), "uuids must be unique"
    closing = "<|im_end|>\n"  # what both templates render after an assistant message
    for t in trajs:
        assert t.status in ("ok", "truncated"), (t.status, t.reason)
        n_prompt = t.infos["prompt_messages"]
        assert tok.decode(t.prompt_ids, skip_special_tokens=False) == render(tok, t.messages[:n_prompt], True)
        trained = t.infos.get("trained_messages") or [
            i for i, m in enumerate(t.messages) if i >= n_prompt and m["role"] == "assistant"]
        marked = copy.deepcopy(t.messages)
        for i in trained:
            marked[i]["content"] = f"@@{i}@@"
        ends_open = t.messages[-1]["role"] == "assistant"
        want = render(tok, marked, not ends_open)
        for i in trained:
            want = want.replace(f"@@{i}@@", t.messages[i]["content"])
        ids = list(t.prompt_ids)
        for turn in t.turns:  # a custom special stop token closes a message like the eos; it is not text
            drop = (any(turn.loss_mask) and turn.finish_reason == "stop" and turn.token_ids
                    and turn.token_ids[-1] in tok.all_special_ids and turn.token_ids[-1] != tok.eos_token_id)
            ids += turn.token_ids[:-1] if drop else turn.token_ids
        have = tok.decode(ids, skip_special_tokens=False)
        assert want.startswith(have) and (have == want or (ends_open and closing.endswith(want[len(have):]))), (have, want)
        last = [turn for turn in t.turns if any(turn.loss_mask)][-1]
        assert (t.status == "truncated") == (last.finish_reason == "length" or t.reason is not None and "max_total" in t.reason)
        if sampler is not None:  # each trained token carries the logprob the sampler reported for it
            for turn in t.turns:
                run = [(tid, lp) for tid, m, lp in zip(turn.token_ids, turn.loss_mask, turn.logprobs) if m]
                if run:
                    assert all(lp is not None for _, lp in run)
                    assert any(_holds(c, run) for c in sampler.completions), "trained tokens the sampler never produced"


def _holds(c: Completion, run: list[tuple[int, float]]) -> bool:
    ids = [tid for tid, _ in run]
    for s in range(len(c.token_ids) - len(ids) + 1):
        if c.token_ids[s:s + len(ids)] == ids:
            return all(abs(c.logprobs[s + k] - lp) < 1e-6 for k, (_, lp) in enumerate(run))
    return False


def prompts(tok: Any, n: int = 2, system: bool = False) -> list[Prompt]:
    out = []
    for i in range(n):
        msgs = ([{"role": "system", "content": "be brief"}] if system else []) + [{"role": "user", "content": f"what is {i} + 3?"}]
        out.append(Prompt(msgs, encode_prompt(tok, msgs), data={"solution": str(i + 3), "env_config": {"name": "count"}}))
    return out


# --- ms-swift style schedulers (our code, ms-swift's API) ----------------------------------------------


class AskAgain(MultiTurnScheduler):
    """Overrides ``step`` (a user message naming ``current_turn``) and ``check_finished``."""

    def check_finished(self, infer_request, response_choice, current_turn):
        if "yes" in response_choice.message.content:
            return True
        return super().check_finished(infer_request, response_choice, current_turn)

    def step(self, infer_request, response_choice, current_turn):
        infer_request.messages.append({"role": "user", "content": f"turn {current_turn} done, again"})
        return {"infer_request": infer_request}


class RoundsWithTokens(MultiTurnScheduler):
    """``run`` override returning one RolloutOutput with per-round token ids and logprobs."""

    async def run(self, infer_request, request_config, **kwargs):
        messages: Messages = infer_request.messages
        ids, masks, lps = [], [], []
        for turn in range(1, (self.max_turns or 2) + 1):
            response = await self.infer_engine.infer_async(infer_request, request_config, **kwargs)
            choice = response.choices[0]
            messages.append({"role": "assistant", "content": choice.message.content})
            ids.append(list(choice.token_ids))
            masks.append([1] * len(choice.token_ids))
            lps.append(self._extract_logprobs_from_choice(choice))
            if self.check_finished(infer_request, choice, turn):
                break
            messages.append({"role": "user", "content": "and then?"})
        return RolloutOutput(response=response, messages=messages, response_token_ids=ids,
                             response_loss_mask=masks, rollout_logprobs=lps, rollout_infos={"num_turns": turn})


class RoundsTextOnly(MultiTurnScheduler):
    """``run`` override returning only the conversation (ms-swift then re-encodes text; we align)."""

    async def run(self, infer_request, request_config, **kwargs):
        for turn in range(1, (self.max_turns or 2) + 1):
            response = await self.infer_engine.infer_async(infer_request, request_config, **kwargs)
            choice = response.choices[0]
            infer_request.messages.append({"role": "assistant", "content": choice.message.content})
            if self.check_finished(infer_request, choice, turn):
                break
            infer_request.messages.append({"role": "user", "content": "and then?"})
        return RolloutOutput(response=response, messages=infer_request.messages, rollout_infos={"num_turns": turn})


def strip_think(text: str) -> str:
    return text.split("</think>")[-1].lstrip() if "</think>" in text else text


class OutputPerRound(MultiTurnScheduler):
    """Several outputs per request (ms-swift's thinking-tips shape): each round is its own output,
    earlier rounds' thinking removed from its history, the round's token ids as one flat list."""

    tip = "not right, check again"

    async def run(self, infer_request, request_config, **kwargs):
        outputs = []
        history: Messages = copy.deepcopy(infer_request.messages)
        for turn in range(1, (self.max_turns or 2) + 1):
            request = copy.deepcopy(infer_request)
            request.messages = copy.deepcopy(history)
            response = await self.infer_engine.infer_async(request, request_config, **kwargs)
            choice = response.choices[0]
            outputs.append(RolloutOutput(response=response, messages=history + [{"role": "assistant", "content": choice.message.content}],
                                         response_token_ids=choice.token_ids, rollout_infos={"num_turns": turn}))
            if choice.finish_reason == "length":
                break
            history = history + [{"role": "assistant", "content": strip_think(choice.message.content)},
                                 {"role": "user", "content": self.tip}]
        return outputs


class TipWithTokens(MultiTurnScheduler):
    """MathTips-style ``step`` returning ``response_token_ids`` / ``response_loss_mask`` /
    ``rollout_logprobs``: the answer is cut before ``<answer>`` and a tip appended (loss mask 0);
    the kept ids are found in token space and the closing eos is not kept inside the message."""

    tips_prompt = " But wait, let me check."

    def check_finished(self, infer_request, response_choice, current_turn):
        if self.tips_prompt in infer_request.messages[-1]["content"]:
            return True
        return super().check_finished(infer_request, response_choice, current_turn)

    def step(self, infer_request, response_choice, current_turn):
        tok = self.tokenizer
        ids = [t for t in response_choice.token_ids if t != tok.eos_token_id]
        lps = self._extract_logprobs_from_choice(response_choice)[: len(ids)]
        text = response_choice.message.content
        cut = text.index("<answer>") if "<answer>" in text else len(text)
        k = len(ids)
        while k and not text[:cut].startswith(tok.decode(ids[:k], skip_special_tokens=False)):
            k -= 1
        kept = tok.decode(ids[:k], skip_special_tokens=False)
        tip_ids = tok.encode(self.tips_prompt, add_special_tokens=False)
        infer_request.messages[-1]["content"] = kept + tok.decode(tip_ids, skip_special_tokens=False)
        return {"infer_request": infer_request, "response_token_ids": ids[:k] + tip_ids,
                "response_loss_mask": [1] * k + [0] * len(tip_ids), "rollout_logprobs": lps[:k]}


class CountEnv(Env):
    """ms-swift ``Env`` shape: ``Env(env_config)``, async reset/step on the message list."""

    async def reset(self, config):
        self.target = int(config.data_dict["solution"])
        return f"count to {self.target}", {"target": self.target}, "You count."

    async def step(self, action):
        said = action[-1]["content"]
        done = str(self.target) in said
        return "go on", (1.0 if done else 0.0), done, {"said": said}

    async def close(self):
        pass


envs = {"count": CountEnv}


class GymLike(RolloutScheduler):
    """GYMScheduler-style: ``__init__(infer_engine, max_turns, **kwargs)`` reading
    ``kwargs.get('gym_env')``, a ``run`` that replaces the messages with the env's system prompt and
    first observation and reports rewards through ``rollout_infos``."""

    def __init__(self, infer_engine, max_turns=None, **kwargs):
        super().__init__(infer_engine, max_turns, **kwargs)
        self.gym_env_name = kwargs.get("gym_env", None)

    async def run(self, infer_request, request_config, **kwargs):
        env_config = infer_request.data_dict.get("env_config", {})
        env = envs[env_config.get("name", self.gym_env_name)](env_config)
        observation, info, system_message = await env.reset(infer_request)
        messages: Messages = [{"role": "system", "content": system_message}, {"role": "user", "content": observation}]
        current_request = copy.deepcopy(infer_request)
        step_rewards, total_reward, done, current_turn = [], 0.0, False, 1
        while not done and current_turn <= (self.max_turns or 3):
            current_request.messages = messages
            response = await self.infer_engine.infer_async(current_request, request_config, **kwargs)
            choice = response.choices[0]
            messages.append({"role": "assistant", "content": choice.message.content})
            next_obs, reward, done, step_info = await env.step(copy.deepcopy(messages))
            total_reward += reward
            step_rewards.append(reward)
            if not done and current_turn < (self.max_turns or 3):
                messages.append({"role": "user", "content": next_obs})
            else:
                break
            current_turn += 1
        await env.close()
        return RolloutOutput(response=response, messages=messages,
                             rollout_infos={"num_turns": current_turn, "total_reward": total_reward, "step_rewards": step_rewards})


class SeedsAtStart(MultiTurnScheduler):
    """``on_trajectory_start`` replaces the messages (system + first observation) and nothing else;
    ``on_turn_end`` reports through ms-swift's ``rollout_infos`` plus a step reward and done."""

    def on_trajectory_start(self, trajectories):
        for t in trajectories:
            t.messages = [{"role": "system", "content": "You are an env."}, {"role": "user", "content": "first observation"}]

    def on_turn_end(self, infer_request, response_choice, current_turn):
        return {"rollout_infos": {f"seen_{current_turn}": True}, "reward": 0.25, "done": "stop" in response_choice.message.content}

    def step(self, infer_request, response_choice, current_turn):
        infer_request.messages.append({"role": "user", "content": f"observation {current_turn + 1}"})
        return {"infer_request": infer_request}


def add(a: int, b: int) -> str:
    return str(a + b)


class ToolsAsCallables(MultiTurnScheduler):
    """ms-swift's ToolCallScheduler keeps a dict of callables in ``self.tools``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tools = {"add": add}

    def check_finished(self, infer_request, response_choice, current_turn):
        if "<tool_call>" not in response_choice.message.content:
            return True
        return super().check_finished(infer_request, response_choice, current_turn)

    def step(self, infer_request, response_choice, current_turn):
        call = re.search(r"<tool_call>\s*(\{.*\})\s*</tool_call>", response_choice.message.content, re.S)
        import json

        spec = json.loads(call.group(1))
        result = self.tools[spec["name"]](**spec["arguments"])
        infer_request.messages.append({"role": "tool", "content": result})
        return {"infer_request": infer_request}


# --- the suite -----------------------------------------------------------------------------------------


async def test_step_and_check_finished_overrides(tok: Any) -> None:
    s = scripted(tok, ["no", "still no", "yes 3"])
    res = await run_rollouts(AskAgain(s, max_turns=5), prompts(tok), sampling_params=PARAMS, progress=False)
    assert [t.num_turns for t in res.trajectories] == [3, 3] and res.trajectories[0].infos["num_turns"] == 3
    assert_sound(res.trajectories, tok, s)


async def test_length_cut_is_truncated(tok: Any) -> None:
    s = scripted(tok, ["one two three four five six seven eight"])
    res = await run_rollouts(AskAgain(s, max_turns=3), prompts(tok), sampling_params=SamplingParams(max_tokens=3), progress=False)
    assert all(t.status == "truncated" for t in res.trajectories)
    assert_sound(res.trajectories, tok, s)


async def test_think_blocks_in_history(tok: Any) -> None:
    """With a think-dropping template and ``multi_turn_mode="append"`` a step scheduler cannot be
    token-exact once a <think> block enters the history: the trajectory fails with a reason naming
    the scheduler and the turn."""
    s = scripted(tok, ["<think>hmm</think>no", "<think>hmm</think>no", "yes", "yes"])  # both requests think first
    set_multi_turn_mode(tok, "append")
    try:
        res = await run_rollouts(AskAgain(s, max_turns=3), prompts(tok), sampling_params=PARAMS, progress=False)
    finally:
        set_multi_turn_mode(tok, "auto")
    if is_prefix_preserving(tok):
        assert_sound(res.trajectories, tok, s)
    else:
        for t in res.trajectories:
            assert t.status == "failed" and t.reason.startswith("scheduler AskAgain turn 1: ChatTemplateError")


@pytest.mark.parametrize("mode", ["auto", "per_turn"])
async def test_think_blocks_in_history_as_per_turn_samples(tok: Any, mode: str) -> None:
    """The same conversation under ``auto`` (the default) and ``per_turn``: every episode trains, and
    every row the trainer packs is one sampler call verbatim after exactly the prompt it was given.
    ``auto`` starts a new sample only where the template rewrites the history; ``per_turn`` at
    every turn after the first."""
    def respond(prompt_ids: list[int], params: Any, index: int) -> str:  # turn 1 thinks, turn 2 does not, turn 3 ends it
        return ["<think>hmm</think>no", "no", "yes"][tok.decode(prompt_ids).count("again")]

    s = RecordingSampler(ScriptedSampler(tokenizer=tok, respond=respond))
    set_multi_turn_mode(tok, mode)
    try:
        res = await run_rollouts(AskAgain(s, max_turns=3), prompts(tok), sampling_params=PARAMS, progress=False)
        assert all(t.status == "ok" for t in res.trajectories), [t.reason for t in res.trajectories]
        assert not check_batch(res.trajectories, tok)
        rows = assert_rows_are_sampler_calls(res.trajectories, s.records, tok)
    finally:
        set_multi_turn_mode(tok, "auto")
    n = len(res.trajectories)
    if mode == "per_turn":
        assert rows == 3 * n  # three turns, three samples each
    elif is_prefix_preserving(tok):
        assert rows == n and not any(t.has_turn_samples for t in res.trajectories)
    else:  # the <think> of turn 1 is dropped from turn 2's history: a new sample there; turn 3 appends
        assert rows == 2 * n
        assert all([turn.role for turn in t.turns] == ["assistant", "prompt", "assistant", "user", "assistant"]
                   for t in res.trajectories)


async def test_run_with_per_round_token_ids(tok: Any) -> None:
    s = scripted(tok, ["first answer", "second answer"])
    res = await run_rollouts(RoundsWithTokens(s, max_turns=2), prompts(tok), sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        # the user turn and its headers are in the token stream, untrained
        assert [turn.role for turn in t.turns] == ["assistant", "user", "assistant"]
        assert t.turns[1].loss_mask == [0] * len(t.turns[1].token_ids) and t.num_turns == 2
    assert_sound(res.trajectories, tok, s)


async def test_run_text_only(tok: Any) -> None:
    s = scripted(tok, ["alpha", "beta"])
    res = await run_rollouts(RoundsTextOnly(s, max_turns=2), prompts(tok), sampling_params=PARAMS, progress=False)
    assert all(t.logprobs_complete and t.num_turns == 2 for t in res.trajectories)
    assert_sound(res.trajectories, tok, s)


async def test_several_outputs_per_request(tok: Any) -> None:
    s = scripted(tok, ["<think>a</think>4", "<think>b</think>3", "<think>c</think>3"])
    res = await run_rollouts(OutputPerRound(s, max_turns=3), prompts(tok, 1), num_generations=2,
                             sampling_params=PARAMS, progress=False)
    assert len(res.trajectories) == 6  # 2 requests x 3 rounds, each its own uuid, one group
    assert len({t.group_id for t in res.trajectories}) == 1
    assert sum(1 for t in res.trajectories if "request_uuid" in t.infos) == 4
    for t in res.trajectories:  # only the round's own answer is trained; history is context
        assert sum(1 for turn in t.turns if any(turn.loss_mask)) == 1
    assert_sound(res.trajectories, tok, s)


async def test_step_returns_response_token_ids(tok: Any) -> None:
    s = scripted(tok, ["so it is <answer>4</answer>", "3 then"])
    res = await run_rollouts(TipWithTokens(s, max_turns=2), prompts(tok), sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert TipWithTokens.tips_prompt in t.messages[-1]["content"]
        tip = [turn for turn in t.turns if not any(turn.loss_mask)]
        assert tip and all(lp is None for turn in tip for lp in turn.logprobs)
    assert_sound(res.trajectories, tok, s)


async def test_step_token_ids_with_the_eos_inside_fail_loudly(tok: Any) -> None:
    """The corruption ms-swift's MathTipsScheduler causes when it keeps the sampled eos: the tokens
    would say "...<|im_end|> But wait" while the conversation does not."""

    class KeepsEos(TipWithTokens):
        def step(self, infer_request, response_choice, current_turn):
            tip_ids = self.tokenizer.encode(self.tips_prompt, add_special_tokens=False)
            infer_request.messages[-1]["content"] += self.tips_prompt
            return {"infer_request": infer_request, "response_token_ids": list(response_choice.token_ids) + tip_ids,
                    "response_loss_mask": [1] * len(response_choice.token_ids) + [0] * len(tip_ids)}

    s = scripted(tok, ["four", "3"])
    res = await run_rollouts(KeepsEos(s, max_turns=2), prompts(tok), sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert t.status == "failed" and t.reason.startswith("invariant violated by scheduler KeepsEos: tokens (turn 1)")


async def test_gym_style_run_with_messages_replaced_and_rollout_infos(tok: Any) -> None:
    s = scripted(tok, ["1 2", "1 2 3"])
    sched = build_scheduler(GymLike, s, tok, gym_env="count", max_turns=3)
    res = await run_rollouts(sched, prompts(tok), sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert t.messages[0] == {"role": "system", "content": "You count."}
        assert t.infos["prompt_messages"] == 2  # the env's system prompt and first observation
        assert t.step_rewards == t.infos["step_rewards"] and t.total_reward == t.infos["total_reward"]
    for t in res.trajectories:  # the target (3 or 4) said ends the episode with reward 1
        assert len(t.step_rewards) == t.num_turns and t.step_rewards[-1] == (1.0 if t.infos["num_turns"] < 3 or t.step_rewards[-1] else 0.0)
    assert any(t.total_reward == 1.0 for t in res.trajectories)
    assert_sound(res.trajectories, tok, s)


async def test_messages_replaced_at_start_reach_the_prompt_tokens(tok: Any) -> None:
    s = scripted(tok, ["go", "please stop"])
    res = await run_rollouts(SeedsAtStart(s, max_turns=4), prompts(tok), sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert tok.decode(t.prompt_ids, skip_special_tokens=False) == render(tok, t.messages[:2], True)
        assert t.infos["seen_1"] and t.infos["seen_2"] and t.step_rewards == [0.25, 0.25] and t.num_turns == 2
    assert_sound(res.trajectories, tok, s)


async def test_tools_as_subclass_attribute(tok: Any) -> None:
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'

    def respond(prompt_ids, params, i):  # call the tool until its answer is in the conversation
        text = tok.decode(prompt_ids, skip_special_tokens=False)
        return "it is 5" if "\n5\n</tool_response>" in text or "tool\n5<|im_end|>" in text else call

    s = Recording(ScriptedSampler(tokenizer=tok, respond=respond))
    sched = ToolsAsCallables(s, max_turns=3)
    assert sched.template_tools is None  # a dict of callables is the scheduler's own, not template schemas
    res = await run_rollouts(sched, prompts(tok), sampling_params=SamplingParams(max_tokens=64), progress=False)
    for t in res.trajectories:
        assert t.messages[-2] == {"role": "tool", "content": "5"} and t.num_turns == 2
    assert_sound(res.trajectories, tok, s)


def test_options_from_flags_reach_kwargs_reads() -> None:
    routed = plugin_options(["--gym-env", "count", "--max-turns", "2"], {"scheduler": GymLike})
    assert routed == {"scheduler": {"gym_env": "count", "max_turns": 2}}
    from rlcore.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown option --gym-enf"):
        plugin_options(["--gym-enf", "count"], {"scheduler": GymLike})


async def test_bad_output_fails_its_trajectory_not_the_batch(chatml: Any) -> None:
    """ms-swift's thinking-tips fallback appends a bare string to messages."""

    class BareString(MultiTurnScheduler):
        async def run(self, infer_request, request_config, **kwargs):
            response = await self.infer_engine.infer_async(infer_request, request_config)
            msgs = infer_request.messages + [response.choices[0].message.content]
            return RolloutOutput(response=response, messages=msgs)

    class Fine(RolloutScheduler):
        pass

    s = scripted(chatml, ["x"])
    res = await run_rollouts(BareString(s), prompts(chatml, 3), sampling_params=PARAMS, progress=False)
    assert res.stats["failed"] == 3
    assert all("BareString returned an output rlcore cannot train on" in t.reason and "each message must be a dict" in t.reason
               for t in res.trajectories)


async def test_on_the_tiny_model(tok: Any, hf_sampler: Any) -> None:
    """The random tiny model through the real ``hf`` sampler: whatever it says, every scheduler's
    trajectories are sound (or failed with a reason, never silently wrong)."""
    s = Recording(hf_sampler)
    s.tokenizer = tok
    params = SamplingParams(max_tokens=8, temperature=1.0, stop_token_ids=list(range(0, 1024, 7)))
    for sched in (AskAgain(s, max_turns=3, tokenizer=tok), RoundsWithTokens(s, max_turns=2, tokenizer=tok),
                  RoundsTextOnly(s, max_turns=2, tokenizer=tok), OutputPerRound(s, max_turns=2, tokenizer=tok),
                  TipWithTokens(s, max_turns=2, tokenizer=tok)):
        res = await run_rollouts(sched, prompts(tok, 2), num_generations=2, sampling_params=params, progress=False)
        sound = [t for t in res.trajectories if t.status != "failed"]
        for t in res.trajectories:
            if t.status == "failed":  # only the documented, loud reason is acceptable
                assert not is_prefix_preserving(tok) and "ChatTemplateError" in t.reason, t.reason
        assert sound or not is_prefix_preserving(tok)
        assert_sound(sound, tok, s)
