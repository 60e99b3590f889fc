"""Conformance with ms-swift 4.x: schedulers written in its API run on rlcore.

ms-swift 4.0 moved the schedulers to ``swift/rollout/`` and gave ``RolloutScheduler`` helpers that
keep assistant messages as their exact token ids (``get_response_token_data``,
``prepare_response_continuation``, ``set_assistant_message_token_ids``,
``snapshot_and_materialize_assistant_messages``, ``restore_assistant_message_snapshots``,
``append_assistant_completion``, ``engine``) and two async hooks (``on_trajectory_start``,
``on_turn_end`` whose ``done`` decides). The schedulers below are our own code, written the way a
4.x user writes one against ms-swift 4.6.0's API (``swift/rollout/multi_turn.py``,
``swift/rollout/gym_env.py``, ``swift/infer_engine/protocol.py``); only the import lines differ from
what one would write for ms-swift (``from swift.rollout import MultiTurnScheduler`` becomes
``from rlcore import MultiTurnScheduler``), as in the 3.x suite (tests/test_scheduler_conformance.py):

* ``OwnRun`` overrides ``run``: it starts its trajectory itself, keeps each answered assistant
  message as token ids between turns, lets text-reading hooks see decoded text, lets ``step``
  rewrite a round's ids (a tip after the sample) and reports per-round ids, masks and logprobs.
  ``AskAgain``, ``TipAfterSample`` and ``TipKeepingEos`` are ``step``/``check_finished`` on top of it.
* ``LakeScheduler`` drives real gymnasium FrozenLake through the hooks only (per-step rewards in
  ``rollout_infos``), on rlcore's loop and under ``OwnRun``.

Every trajectory is held to rlcore's invariant checker and to an independent check of the token
rule (``sound``), or fails with the reason rlcore documents (docs/porting-ms-swift.md) where what
ms-swift does is what rlcore refuses.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import attrs
import pytest

from rlcore import Env, MultiTurnScheduler
from rlcore.chat_template import set_multi_turn_mode
from rlcore.compat.swift import remove_response
from rlcore.rollout import RolloutOutput, build_scheduler, check_batch, encode_prompt, run_rollouts
from rlcore.testing import THINK_DROPPING_TEMPLATE, ScriptedSampler
from rlcore.testing.multi_turn import RecordingSampler, assert_rows_are_sampler_calls
from rlcore.types import Completion, Prompt, SamplingParams, Trajectory

PARAMS = SamplingParams(max_tokens=24)



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





# --- our schedulers, in ms-swift 4.x's API -----------------------------------------------------------------


@attrs.define
class AssistantRounds:
    """What a 4.x ``run`` reports, one entry per assistant message: its token ids, loss mask and
    the logprobs of its sampled (mask-1) tokens."""

    ids: list[list[int]] = attrs.Factory(list)
    masks: list[list[int]] = attrs.Factory(list)
    logprobs: list[list[float]] = attrs.Factory(list)

    def record(self, ids: list[int], mask: list[int], logprobs: list[float], same_message: bool) -> None:
        """A continuation grows the message it continues; anything else is a new message."""
        if same_message and self.ids:
            self.ids[-1] += ids
            self.masks[-1] += mask
            self.logprobs[-1] += logprobs
        else:
            self.ids.append(list(ids))
            self.masks.append(list(mask))
            self.logprobs.append(list(logprobs))

    def logprobs_for_training(self) -> list[list[float]]:
        """All or nothing: importance-sampling correction needs one logprob per trained token."""
        have = sum(len(x) for x in self.logprobs)
        return self.logprobs if have and have == sum(sum(m) for m in self.masks) else []


class OwnRun(MultiTurnScheduler):
    """A 4.x user's ``run`` override, built on the base class's helpers."""

    async def run(self, infer_request, request_config, **kwargs):
        request = infer_request
        await self.on_trajectory_start([request])  # a 4.x run starts its own trajectory
        remove_response(request.messages)  # a dataset row may end with its reference answer
        rounds = AssistantRounds()
        infos: dict[str, Any] = {}
        turn = 0
        while True:
            turn += 1
            response = await self.engine.infer_async(request, request_config, **kwargs)
            choice = response.choices[0]
            continued = self.append_assistant_completion(request, choice.message.content)
            finished = await self.turn_over(request, choice, turn, infos)
            ids, mask = self.get_response_token_data(request, choice, is_continuation=continued)
            logprobs = self._extract_logprobs_from_choice(choice)
            if finished:
                rounds.record(ids, mask, logprobs, continued)
                return RolloutOutput(response=response, messages=request.messages, response_token_ids=rounds.ids,
                                     response_loss_mask=rounds.masks, rollout_logprobs=rounds.logprobs_for_training(),
                                     rollout_infos={**infos, "num_turns": turn})
            edit = self.step(request, choice, turn)
            request = edit["infer_request"]
            if "response_token_ids" in edit:  # the step rewrote this round's tokens, e.g. a tip after the sample
                ids, mask = self.get_response_token_data(request, choice, continued, edit["response_token_ids"],
                                                         edit.get("response_loss_mask"))
                logprobs = edit.get("rollout_logprobs") or logprobs
            infos.update(edit.get("rollout_infos") or {})
            rounds.record(ids, mask, logprobs, continued)
            self.set_assistant_message_token_ids(request, rounds.ids[-1])  # the next turn reads exactly these ids

    async def turn_over(self, request, choice, turn: int, infos: dict[str, Any]) -> bool:
        """The hooks read text: decode the token-backed history for them, then put the ids back.
        ``on_turn_end``'s ``done``, when given, is the answer; ``max_turns`` always ends it."""
        decoded = self.snapshot_and_materialize_assistant_messages(request)
        try:
            verdict = await self.on_turn_end(request, choice, turn)
            infos.update(verdict.get("rollout_infos") or {})
            finished = verdict["done"] if "done" in verdict else self.check_finished(request, choice, turn)
        finally:
            self.restore_assistant_message_snapshots(decoded)
        return bool(finished) or bool(self.max_turns and turn >= self.max_turns)


class AskAgain(OwnRun):
    """``OwnRun`` with a ``step`` that asks again in a new user message until the answer says yes."""

    def check_finished(self, infer_request, response_choice, current_turn):
        if "yes" in response_choice.message.content:
            return True
        return super().check_finished(infer_request, response_choice, current_turn)

    def step(self, infer_request, response_choice, current_turn):
        infer_request.messages.append({"role": "user", "content": f"turn {current_turn} done, again"})
        return {"infer_request": infer_request}


class TipAfterSample(OwnRun):
    """A continuation: ``step`` appends a tip after the sampled tokens with
    ``prepare_response_continuation`` (rlcore's drops the sampled eos) and ``OwnRun`` freezes the
    message as those ids (``set_assistant_message_token_ids``)."""

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
    """The ids ms-swift 4.6.0's ``prepare_response_continuation`` gives: the sampled eos kept."""

    def step(self, infer_request, response_choice, current_turn):
        ids = list(response_choice.token_ids)
        tip_ids = self.tokenizer.encode(self.tip, add_special_tokens=False)
        return {"infer_request": infer_request, "response_token_ids": ids + tip_ids,
                "response_loss_mask": [1] * len(ids) + [0] * len(tip_ids)}


@attrs.define
class Episode:
    """One trajectory's env, its rewards so far, and what it said last (shown by ``step``)."""

    env: Env
    rewards: list[float] = attrs.Factory(list)
    observation: str | None = None


class LakeScheduler(MultiTurnScheduler):
    """A 4.x env scheduler on the universal hooks alone: ``on_trajectory_start`` opens the env the
    row's ``env_config`` names and puts its first observation in the messages; ``on_turn_end``
    hands it the conversation and answers ``done`` with the per-step rewards in ``rollout_infos``;
    ``step`` shows the model the env's answer. An env is closed when its episode ends."""

    env_types = {"frozen_lake": FrozenLakeEnv}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.episodes: dict[str, Episode] = {}

    async def on_trajectory_start(self, requests):
        await asyncio.gather(*(self.open_episode(r) for r in requests))

    async def open_episode(self, request) -> None:
        config = dict(request.data_dict.get("env_config") or {})
        env = self.env_types[config["name"]](config)
        first, _info, system = await env.reset(request)
        request.messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": first}]
        self.episodes[request.uuid] = Episode(env)

    async def on_turn_end(self, infer_request, response_choice, current_turn):
        episode = self.episodes.get(infer_request.uuid)
        if episode is None:
            return {"done": True}
        observation, reward, done, _info = await episode.env.step(copy.deepcopy(infer_request.messages))
        episode.rewards.append(float(reward))
        episode.observation = None if done else observation
        if done:
            del self.episodes[infer_request.uuid]
            await episode.env.close()
        return {"done": done, "rollout_infos": {"total_reward": sum(episode.rewards),
                                                "step_rewards": list(episode.rewards), "gym_done": done}}

    def step(self, infer_request, response_choice, current_turn):
        episode = self.episodes.get(infer_request.uuid)
        if episode is not None and episode.observation is not None:
            infer_request.messages.append({"role": "user", "content": episode.observation})
            episode.observation = None
        return {"infer_request": infer_request}


class LakeUnderOwnRun(OwnRun, LakeScheduler):
    """``LakeScheduler``'s hooks under ``OwnRun``, which calls ``on_trajectory_start`` itself."""


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


# --- a 4.x-style run override -------------------------------------------------------------------------------


async def test_own_run_with_new_user_messages(tok: Any) -> None:
    s = scripted(tok, ["no", "still no", "yes 3"])
    res = await run_rollouts(AskAgain(s, max_turns=5), questions(tok), sampling_params=PARAMS, progress=False)
    for t in res.trajectories:  # each answer its own round: trained, with the user turns untrained between
        assert t.num_turns == 3 and [m["role"] for m in t.messages] == ["user", "assistant", "user", "assistant", "user", "assistant"]
        assert [m["content"] for m in t.messages if m["role"] == "assistant"] == ["no", "still no", "yes 3"]
        assert sum(1 for turn in t.turns if any(turn.loss_mask)) == 3 and t.logprobs_complete
    sound(res.trajectories, tok, s)


async def test_own_run_continuation_after_the_sampled_tokens(tok: Any) -> None:
    s = scripted(tok, ["so it is 4", " no, 3"])
    res = await run_rollouts(TipAfterSample(s, max_turns=3), questions(tok), sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert t.messages[-1] == {"role": "assistant", "content": "so it is 4" + TipAfterSample.tip + " no, 3"}
        first, tip = (tok.encode(x, add_special_tokens=False) for x in ("so it is 4", TipAfterSample.tip))
        second = tok.encode(" no, 3", add_special_tokens=False) + [tok.eos_token_id]
        assert t.completion_ids == first + tip + second  # the first sample's eos left out
        assert t.loss_mask == [1] * len(first) + [0] * len(tip) + [1] * len(second)
    sound(res.trajectories, tok, s)


async def test_own_run_keeping_the_eos_fails_loudly(tok: Any) -> None:
    """ms-swift 4.6.0's base run re-sends a continued message with the sampled eos inside, as this does."""
    s = scripted(tok, ["so it is 4", " no, 3"])
    res = await run_rollouts(TipKeepingEos(s, max_turns=3), questions(tok), sampling_params=PARAMS, progress=False)
    for t in res.trajectories:
        assert t.status == "failed"
        assert t.reason.startswith("scheduler TipKeepingEos turn 1: MessagesEditError: token-backed assistant message 1 holds the closing token '<|im_end|>'"), t.reason


async def test_own_run_on_a_template_that_drops_thinking(tok: Any) -> None:
    """ms-swift 4.x keeps the history as token ids, so a template that drops earlier ``<think>``
    blocks (Qwen3's) never re-renders them; rlcore holds every trajectory to the template's
    rendering of its final messages, which no longer shows them: the trajectory fails at that turn
    with the ChatTemplateError reason docs/porting-ms-swift.md gives under ``multi_turn_mode="append"``
    (one output per round is the shape that works there); under ``auto``, the default, that turn
    is a sample of its own, its prompt the history as the template renders it."""
    dropping = copy.deepcopy(tok)
    dropping.chat_template = THINK_DROPPING_TEMPLATE
    set_multi_turn_mode(dropping, "append")
    s = scripted(dropping, ["<think>hmm</think>no", "yes"])
    res = await run_rollouts(AskAgain(s, max_turns=3), questions(dropping, 1), sampling_params=PARAMS, progress=False)
    t = res.trajectories[0]
    assert t.status == "failed" and t.reason.startswith("scheduler AskAgain turn 1: ChatTemplateError"), t.reason
    set_multi_turn_mode(dropping, "auto")
    s = RecordingSampler(ScriptedSampler(["<think>hmm</think>no", "yes"], dropping))
    res = await run_rollouts(AskAgain(s, max_turns=3), questions(dropping, 1), sampling_params=PARAMS, progress=False)
    t = res.trajectories[0]
    assert t.status == "ok" and t.has_turn_samples and not check_batch([t], dropping), t.reason
    assert assert_rows_are_sampler_calls([t], s.records, dropping) == 2
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


# --- a hook-based env scheduler on real gymnasium environments ----------------------------------------------


async def test_lake_scheduler_reaches_the_goal(tok: Any) -> None:
    FrozenLakeEnv.resets = FrozenLakeEnv.closes = 0
    s = scripted(tok, SAFE_PATH)
    sched = build_scheduler(LakeScheduler, s, tok, max_turns=8)
    res = await run_rollouts(sched, questions(tok, 1), sampling_params=PARAMS, progress=False)
    t = res.trajectories[0]
    assert t.messages[0] == {"role": "system", "content": "You cross a frozen lake."}
    assert t.num_turns == 6 and t.step_rewards == [0.0] * 5 + [1.0] and t.infos["total_reward"] == 1.0
    assert t.infos["gym_done"] is True and t.infos["prompt_messages"] == 2
    assert FrozenLakeEnv.resets == 1 and FrozenLakeEnv.closes == 1
    sound(res.trajectories, tok, s)


async def test_lake_scheduler_invalid_moves_and_holes(tok: Any) -> None:
    s = scripted(tok, ["I will go DOWN", "jump", "RIGHT"])  # cell 4, invalid, cell 5 is a hole
    res = await run_rollouts(build_scheduler(LakeScheduler, s, tok, max_turns=8), questions(tok, 1), sampling_params=PARAMS, progress=False)
    t = res.trajectories[0]
    assert t.num_turns == 3 and t.step_rewards == [0.0, 0.0, 0.0] and t.infos["gym_done"] is True
    assert "Say one of LEFT" in t.messages[-2]["content"]
    sound(res.trajectories, tok, s)


async def test_lake_hooks_under_own_run_reset_once(tok: Any) -> None:
    """A 4.x run calls on_trajectory_start itself; rlcore's driver already did: once only."""
    FrozenLakeEnv.resets = 0
    s = scripted(tok, SAFE_PATH)
    res = await run_rollouts(build_scheduler(LakeUnderOwnRun, s, tok, max_turns=8), questions(tok, 2),
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
    from rlcore.rollout.stream import MessagesEditError

    req.messages[1]["content"] = ids + [eos]  # going on after the sampled eos would train it mid-message
    with pytest.raises(MessagesEditError, match="holds the closing token '<\\|im_end\\|>'"):
        sched.append_assistant_completion(req, " more")
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


async def test_on_the_tiny_model(tok: Any, tiny_hf_sampler: Any) -> None:
    """Whatever the random tiny model says, the 4.x-style schedulers' trajectories are sound."""
    s = Recording(tiny_hf_sampler)
    params = SamplingParams(max_tokens=8, temperature=1.0, stop_token_ids=list(range(0, 1024, 7)))
    for cls in (AskAgain, TipAfterSample, LakeScheduler, LakeUnderOwnRun):
        sched = build_scheduler(cls, s, tok, max_turns=3)
        res = await run_rollouts(sched, questions(tok, 2), num_generations=2, sampling_params=params, progress=False)
        ok = [t for t in res.trajectories if t.status != "failed"]
        assert ok and len(ok) == len(res.trajectories), [t.reason for t in res.trajectories]
        sound(ok, tok, s)
