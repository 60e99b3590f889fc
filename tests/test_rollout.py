"""Schedulers and the driver with scripted completions and the real tiny tokenizer/template."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rlcore
from rlcore.rollout import (
    MultiTurnScheduler,
    check_batch,
    RolloutOutput,
    RolloutScheduler,
    encode_prompt,
    render,
    run_rollouts,
)
from rlcore.chat_template import set_multi_turn_mode
from rlcore.testing import ScriptedSampler
from rlcore.types import Completion, Prompt, SamplingParams, Trajectory

PARAMS = SamplingParams(max_tokens=24)


@pytest.fixture(scope="module")
def tok(tiny_model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def prompts(tok: Any, n: int = 1) -> list[Prompt]:
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"what is {i} + 3?"}]
        out.append(Prompt(msgs, encode_prompt(tok, msgs), data={"answer": str(i + 3)}))
    return out


def stream_text(tok: Any, t: Trajectory) -> str:
    return tok.decode(t.input_ids, skip_special_tokens=False)


class AskAgain(MultiTurnScheduler):
    """ms-swift style: only appends a user message in step."""

    def step(self, infer_request, response_choice, current_turn):
        infer_request.messages.append({"role": "user", "content": f"are you sure? ({current_turn})"})
        return {"infer_request": infer_request}


async def test_single_turn_layout(tok: Any) -> None:
    sampler = ScriptedSampler(["the answer is 3"], tok)
    res = await run_rollouts(RolloutScheduler(sampler), prompts(tok, 2), num_generations=2, sampling_params=PARAMS, progress=False)
    assert len(res.trajectories) == 4 and res.stats["ok"] == 4 and res.stats["turns"] == 4
    t = res.trajectories[0]
    assert t.prompt_ids == prompts(tok, 1)[0].prompt_ids
    assert t.completion_ids == tok.encode("the answer is 3", add_special_tokens=False) + [tok.eos_token_id]
    assert t.loss_mask == [1] * len(t.completion_ids)
    assert all(lp is not None and lp < 0 for lp in t.logprobs)
    assert t.messages[-1] == {"role": "assistant", "content": "the answer is 3"}
    assert t.infos["logprobs_complete"] is True and t.num_turns == 1 and t.data["answer"] == "3"
    # a group shares one group_id, different prompts do not
    groups = [x.group_id for x in res.trajectories]
    assert groups[0] == groups[1] != groups[2] == groups[3]


async def test_multi_turn_observation_tokens_are_the_template_delta(tok: Any) -> None:
    sampler = ScriptedSampler(["first try", "second try", "third try"], tok)
    res = await run_rollouts(AskAgain(sampler, max_turns=3), prompts(tok), sampling_params=PARAMS, progress=False)
    t = res.trajectories[0]
    assert t.status == "ok" and t.num_turns == 3
    assert [turn.role for turn in t.turns] == ["assistant", "user", "assistant", "user", "assistant"]
    # the stream is exactly the rendered conversation (minus the template's trailing newline)
    assert stream_text(tok, t) + "\n" == render(tok, t.messages)
    obs = t.turns[1]
    assert obs.loss_mask == [0] * len(obs.token_ids) and obs.logprobs == [None] * len(obs.token_ids)
    # the missing "\n" after the sampled <|im_end|> comes first, then the user turn and the assistant header
    assert obs.text == "\n<|im_start|>user\nare you sure? (1)<|im_end|>\n<|im_start|>assistant\n"
    # sampled tokens are untouched: the sampler saw, at turn 2, exactly the stream up to there
    second_prompt = sampler.calls[1][0]
    assert second_prompt == t.prompt_ids + t.turns[0].token_ids + t.turns[1].token_ids


async def test_continuation_extends_the_assistant_message(tok: Any) -> None:
    class Tip(MultiTurnScheduler):
        def step(self, infer_request, response_choice, current_turn):
            infer_request.messages[-1]["content"] += " But wait, let me check"
            return {"infer_request": infer_request}

    sampler = ScriptedSampler(["it is 4.", " no, it is 3"], tok)
    res = await run_rollouts(Tip(sampler, max_turns=2), prompts(tok), sampling_params=PARAMS, progress=False)
    t = res.trajectories[0]
    first = t.turns[0]
    assert first.token_ids == tok.encode("it is 4.", add_special_tokens=False)  # eos trimmed, no new header
    assert first.loss_mask == [1] * len(first.token_ids) and None not in first.logprobs
    assert t.turns[1].role == "continuation" and set(t.turns[1].loss_mask) == {0}
    assert t.messages[-1]["content"] == "it is 4. But wait, let me check no, it is 3"
    assert len([m for m in t.messages if m["role"] == "assistant"]) == 1
    assert stream_text(tok, t) == render(tok, t.messages[:1], add_generation_prompt=True) + t.messages[-1]["content"] + "<|im_end|>"
    assert t.infos["trimmed_tokens"] == 1


async def test_step_response_token_ids_and_infos(tok: Any) -> None:
    extra = tok.encode(" [tool says 7]", add_special_tokens=False)

    class ExplicitTokens(MultiTurnScheduler):
        def step(self, infer_request, response_choice, current_turn):
            ids = list(response_choice.token_ids[:-1]) + extra
            infer_request.messages[-1]["content"] = response_choice.message.content + " [tool says 7]"
            return {
                "infer_request": infer_request,
                "response_token_ids": ids,
                "response_loss_mask": [1] * (len(ids) - len(extra)) + [0] * len(extra),
                "rollout_infos": {"tool_results": "7", "num_turns": current_turn},
            }

    sampler = ScriptedSampler(["call", " done"], tok)
    res = await run_rollouts(ExplicitTokens(sampler, max_turns=2), prompts(tok), sampling_params=PARAMS, progress=False)
    t = res.trajectories[0]
    call_ids = tok.encode("call", add_special_tokens=False)
    n = len(call_ids)
    assert t.completion_ids[: n + len(extra)] == call_ids + extra
    assert t.loss_mask[: n + len(extra)] == [1] * n + [0] * len(extra)
    assert all(lp is not None for lp in t.logprobs[:n])  # kept from the sampler where ids match
    assert t.infos["tool_results"] == "7" and t.logprobs_complete


async def test_check_finished_override_and_observer_merge(tok: Any) -> None:
    class StopOnYes(AskAgain):
        def check_finished(self, infer_request, response_choice, current_turn):
            return "yes" in response_choice.message.content or super().check_finished(infer_request, response_choice, current_turn)

    class Observer:
        name = "obs"

        @rlcore.hookimpl
        def on_turn_end(self, infer_request, response_choice, current_turn):
            return {"reward": 0.5, "infos": {f"seen_{current_turn}": True}}

    class Stopper:
        name = "stopper"

        @rlcore.hookimpl
        async def on_turn_end(self, infer_request, response_choice, current_turn):
            return {"done": "stop" in response_choice.message.content}

    sampler = ScriptedSampler(["no", "yes"], tok)
    res = await run_rollouts(StopOnYes(sampler, max_turns=5), prompts(tok), sampling_params=PARAMS,
                             components=[Observer(), Stopper()], progress=False)
    t = res.trajectories[0]
    assert t.status == "ok" and t.num_turns == 2
    assert t.infos["observers"]["obs"] == {"seen_1": True, "seen_2": True}
    # an observer's reward is logged, never trained on
    assert t.step_rewards == [] and t.infos["observer_rewards"]["obs"] == [0.5, 0.5]

    sampler = ScriptedSampler(["please stop", "yes"], tok)
    res = await run_rollouts(StopOnYes(sampler, max_turns=5), prompts(tok), sampling_params=PARAMS,
                             components=[Observer(), Stopper()], progress=False)
    assert res.trajectories[0].num_turns == 2  # an observer's done does not end the trajectory

    class LetsObserversStop(StopOnYes):
        observers_may_stop = True

    sampler = ScriptedSampler(["please stop", "yes"], tok)
    res = await run_rollouts(LetsObserversStop(sampler, max_turns=5), prompts(tok), sampling_params=PARAMS,
                             components=[Observer(), Stopper()], progress=False)
    assert res.trajectories[0].num_turns == 1  # ... unless the scheduler asks them to


async def test_run_overridden_ms_swift_style(tok: Any) -> None:
    from rlcore.compat.swift import MultiTurnScheduler  # ms-swift's base class (infer_engine)

    class MyRun(MultiTurnScheduler):
        async def run(self, infer_request):
            rounds = []
            for turn in range(1, 3):
                response = await self.infer_engine.infer_async(infer_request, PARAMS)
                choice = response.choices[0]
                infer_request.messages.append({"role": "assistant", "content": choice.message.content})
                if turn < 2:
                    infer_request.messages.append({"role": "user", "content": "again"})
                rounds.append(choice)
            return infer_request

    sampler = ScriptedSampler(["a1", "a2"], tok)
    sched = MyRun(infer_engine=sampler)  # ms-swift's constructor keyword
    assert sched.sampler is sampler
    res = await run_rollouts(sched, prompts(tok), progress=False)
    t = res.trajectories[0]
    assert [turn.role for turn in t.turns] == ["assistant", "user", "assistant"]
    assert stream_text(tok, t) + "\n" == render(tok, t.messages)
    assert t.status == "ok" and t.num_turns == 2  # counted from sampled turns

    class Split(MultiTurnScheduler):
        async def run(self, infer_request):
            out = RolloutOutput(messages=infer_request.messages + [{"role": "assistant", "content": "x"}],
                                response_token_ids=[[5, 6], [7]], response_loss_mask=[[1, 1], [0]],
                                rollout_infos={"k": 1})
            other = Trajectory(prompt_ids=list(infer_request.prompt_ids), messages=list(infer_request.messages))
            return [out, other]

    # two rounds of response_token_ids but one assistant message: ms-swift's per-round meaning
    # cannot hold, so the trajectory fails with a reason instead of training misaligned tokens
    res = await run_rollouts(Split(ScriptedSampler(["-"], tok)), prompts(tok), progress=False)
    (a,) = res.trajectories
    assert a.status == "failed" and "2 rounds of response_token_ids" in a.reason and "Split" in a.reason


async def test_a_run_override_signature_is_read_once_per_rollout_not_per_trajectory(tok: Any) -> None:
    """The driver asks once per run_rollouts whether ``run`` takes the sampling params (inspecting a
    signature costs about half a millisecond: per trajectory it was a tenth of a tiny-model driver's
    CPU); both call forms still work."""
    import inspect

    reads: list[int] = []

    class CountedRun:
        """A callable ``run`` whose signature reads are counted (inspect.signature reads __signature__)."""

        def __init__(self, scheduler: Any, with_params: bool) -> None:
            self.scheduler, self.with_params, self.params_seen = scheduler, with_params, []

        @property
        def __signature__(self) -> inspect.Signature:
            reads.append(1)
            names = ["trajectory", "request_config"] if self.with_params else ["trajectory"]
            return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])

        async def __call__(self, trajectory: Any, *rest: Any) -> Any:
            self.params_seen.append(rest)
            return await RolloutScheduler.run(self.scheduler, trajectory)

    for with_params in (True, False):
        reads.clear()
        sched = RolloutScheduler(ScriptedSampler(["ok"], tok), sampling_params=PARAMS)
        sched.run = CountedRun(sched, with_params)  # type: ignore[method-assign]
        res = await run_rollouts(sched, prompts(tok, 4), num_generations=2, progress=False)
        assert res.stats["ok"] == 8, res.stats
        assert len(reads) == 1, f"signature read {len(reads)} times for 8 trajectories"
        assert sched.run.params_seen == ([(PARAMS,)] * 8 if with_params else [()] * 8)


async def test_failures_timeouts_and_cleanup(tok: Any) -> None:
    ended: list[str] = []

    class Flaky(AskAgain):
        def on_turn_end(self, infer_request, response_choice, current_turn):
            if infer_request.data["answer"] == "4":
                raise RuntimeError("env exploded")
            return None

        def on_trajectory_end(self, trajectory):
            ended.append(trajectory.status)

    sampler = ScriptedSampler(["x"], tok)
    res = await run_rollouts(Flaky(sampler, max_turns=2), prompts(tok, 3), sampling_params=PARAMS, progress=False)
    assert res.stats["failed"] == 1 and res.stats["ok"] == 2
    bad = [t for t in res.trajectories if t.status == "failed"][0]
    assert bad.reason == "scheduler Flaky turn 1: RuntimeError: env exploded"
    assert sorted(ended) == ["failed", "ok", "ok"]  # called on every path
    assert res.stats["failure_reasons"] == {"scheduler Flaky turn 1: RuntimeError: env exploded": 1}

    slow = ScriptedSampler(["slow"], tok, delay=2.0)
    res = await run_rollouts(RolloutScheduler(slow), prompts(tok), progress=False, timeout=0.2)
    assert res.trajectories[0].status == "failed" and res.trajectories[0].reason == "timed out after 0.2s"


async def test_truncation_and_incomplete_logprobs(tok: Any) -> None:
    sampler = ScriptedSampler(["one two three four five six seven eight nine ten"], tok, logprobs=False)
    res = await run_rollouts(AskAgain(sampler, max_turns=3), prompts(tok), sampling_params=SamplingParams(max_tokens=3), progress=False)
    t = res.trajectories[0]
    assert t.status == "truncated" and t.reason == "max_tokens reached" and t.num_turns == 1
    assert len(t.completion_ids) == 3
    assert t.logprobs_complete is False and t.infos["logprobs_complete"] is False
    assert res.stats["truncated"] == 1 and res.stats["logprobs_incomplete"] == 1


async def test_concurrency_is_bounded_and_overlaps(tok: Any) -> None:
    in_flight = 0
    peak = 0

    async def respond_slowly(prompt_ids, params, i):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return "ok"

    class Respond(ScriptedSampler):
        async def generate(self, prompt_ids, params):
            await respond_slowly(prompt_ids, params, 0)
            return await super().generate(prompt_ids, params)

    sampler = Respond(["ok"], tok)
    res = await run_rollouts(RolloutScheduler(sampler), prompts(tok, 12), concurrency=4, progress=False)
    assert res.stats["ok"] == 12 and peak == 4


def test_progress_bar_counts() -> None:
    from rlcore.rollout.progress import RolloutProgress

    done = [Trajectory(prompt_ids=[1], num_turns=3, status="ok"), Trajectory(prompt_ids=[1], num_turns=1, status="failed")]
    with RolloutProgress(2, enabled=True) as bar:
        bar.advance(done[:1])
        bar.advance(done[1:])
        task = bar._progress.tasks[0]
        assert task.completed == 2 and task.fields == {"turns": 4, "failed": 1}
    assert RolloutProgress(2, enabled=False).__enter__()._progress is None


async def test_registered_schedulers() -> None:
    assert rlcore.get("scheduler", "default") is RolloutScheduler
    assert rlcore.get("scheduler", "single_turn") is RolloutScheduler
    assert rlcore.get("scheduler", "multi_turn") is MultiTurnScheduler
    from rlcore.rollout import ToolScheduler

    assert rlcore.get("scheduler", "tool_scheduler") is ToolScheduler
    assert MultiTurnScheduler().max_turns == 4 and RolloutScheduler().max_turns == 1


async def test_check_finished_returning_none_goes_on_until_max_turns(tok: Any) -> None:
    """One check_finished (the scheduler's, no second default): None is "not finished", and
    max_turns still bounds the loop (ms-swift's double check)."""

    class NoOpinion(MultiTurnScheduler):
        def check_finished(self, infer_request, response_choice, current_turn):
            return None

    res = await run_rollouts(NoOpinion(ScriptedSampler(["a", "b", "c"], tok), max_turns=3), prompts(tok),
                             sampling_params=PARAMS, progress=False)
    assert res.trajectories[0].num_turns == 3 and res.trajectories[0].status == "ok"


async def test_non_prefix_preserving_template_is_a_clear_error(tok: Any) -> None:
    import copy

    from rlcore.rollout import ChatTemplateError, encode_observation

    bad = copy.deepcopy(tok)
    bad.chat_template = "{{ messages | length }} messages\n" + tok.chat_template  # changes the head every turn
    before = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    with pytest.raises(ChatTemplateError, match="not prefix-preserving"):
        encode_observation(bad, before, [{"role": "user", "content": "again"}])
    good = encode_observation(tok, before, [{"role": "user", "content": "again"}])
    assert tok.decode(good) == "<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"

    msgs = [{"role": "user", "content": "hi"}]
    set_multi_turn_mode(bad, "append")  # one sequence per episode, or a loud failure
    res = await run_rollouts(AskAgain(ScriptedSampler(["yo", "ok"], bad), tokenizer=bad, max_turns=2),
                             [Prompt(msgs, encode_prompt(bad, msgs))], progress=False)
    t = res.trajectories[0]
    assert t.status == "failed" and "AskAgain turn 1: ChatTemplateError: the chat template is not prefix-preserving" in t.reason
    assert "multi_turn_mode auto or per_turn" in t.reason  # the way out, named

    set_multi_turn_mode(bad, "auto")  # the default: turn 2 is a sample of its own, its prompt re-rendered
    res = await run_rollouts(AskAgain(ScriptedSampler(["yo", "ok"], bad), tokenizer=bad, max_turns=2),
                             [Prompt(msgs, encode_prompt(bad, msgs))], progress=False)
    t = res.trajectories[0]
    assert t.status == "ok" and [turn.role for turn in t.turns] == ["assistant", "prompt", "assistant"]
    assert bad.decode(t.turns[1].token_ids) == bad.apply_chat_template(t.messages[:3], tokenize=False, add_generation_prompt=True)
    assert not check_batch([t], bad)


async def test_rewriting_history_fails_the_trajectory(tok: Any) -> None:
    class Rewriter(MultiTurnScheduler):
        def step(self, infer_request, response_choice, current_turn):
            infer_request.messages[0]["content"] = "a different question"
            infer_request.messages.append({"role": "user", "content": "go on"})
            return {"infer_request": infer_request}

    res = await run_rollouts(Rewriter(ScriptedSampler(["a"], tok), max_turns=2), prompts(tok), progress=False)
    t = res.trajectories[0]
    assert t.status == "failed" and "changed message 0 (user) which is already in the token stream" in t.reason


async def test_ms_swift_tool_call_pattern_with_eos_inside(tok: Any) -> None:
    """ms-swift's ToolCallScheduler: the tool result goes into the assistant message and the
    returned token ids are the sampled ids (eos included) + the result's ids with loss mask 0."""

    class ToolInline(MultiTurnScheduler):
        def step(self, infer_request, response_choice, current_turn):
            result = " => 42."
            infer_request.messages[-1]["content"] += result
            res_ids = tok.encode(result, add_special_tokens=False)
            ids = list(response_choice.token_ids) + res_ids
            return {"infer_request": infer_request, "response_token_ids": ids,
                    "response_loss_mask": [1] * len(response_choice.token_ids) + [0] * len(res_ids)}

    # as written, the sampled eos ends up inside the kept message: the tokens say
    # "compute<|im_end|> => 42." while the conversation says "compute => 42." -> fails loudly
    sampler = ScriptedSampler(["compute", " so 42"], tok)
    res = await run_rollouts(ToolInline(sampler, max_turns=2), prompts(tok), progress=False)
    t = res.trajectories[0]
    assert t.status == "failed" and t.infos["invariant"] == "tokens"
    assert t.reason.startswith("invariant violated by scheduler ToolInline: tokens (turn 1)") and "<|im_end|> => 42." in t.reason

    class ToolInlineNoEos(MultiTurnScheduler):
        def step(self, infer_request, response_choice, current_turn):
            result = " => 42."
            infer_request.messages[-1]["content"] += result
            res_ids = tok.encode(result, add_special_tokens=False)
            kept = [i for i in response_choice.token_ids if i != tok.eos_token_id]
            return {"infer_request": infer_request, "response_token_ids": kept + res_ids,
                    "response_loss_mask": [1] * len(kept) + [0] * len(res_ids)}

    sampler = ScriptedSampler(["compute", " so 42"], tok)
    res = await run_rollouts(ToolInlineNoEos(sampler, max_turns=2), prompts(tok), progress=False)
    t = res.trajectories[0]
    assert t.status == "ok", t.reason
    first = tok.encode("compute", add_special_tokens=False)
    assert t.completion_ids[: len(first)] == first and all(lp is not None for lp in t.logprobs[: len(first)])
    assert sampler.calls[1][0] == t.prompt_ids + t.completion_ids[: len(sampler.calls[1][0]) - len(t.prompt_ids)]
    assert t.messages[-1]["content"] == "compute => 42. so 42" and t.logprobs_complete


async def test_template_that_rewrites_assistant_text_still_closes_the_turn(tok: Any) -> None:
    """A template that trims assistant content cannot show the sampled text verbatim; the engine
    keeps the sampled tokens and appends only the generic closing ("\\n") before the next message."""
    import copy

    trim = copy.deepcopy(tok)
    trim.chat_template = tok.chat_template.replace(
        "{{ message['role'] }}\n{{ message['content'] }}", "{{ message['role'] }}\n{{ message['content'] | trim }}"
    )
    assert trim.chat_template != tok.chat_template
    msgs = [{"role": "user", "content": "hi"}]
    sampler = ScriptedSampler(["spaced out   ", "fine"], trim)
    res = await run_rollouts(AskAgain(sampler, tokenizer=trim, max_turns=2), [Prompt(msgs, encode_prompt(trim, msgs))], progress=False)
    t = res.trajectories[0]
    assert t.status == "ok", t.reason
    assert t.turns[0].token_ids == trim.encode("spaced out   ", add_special_tokens=False) + [trim.eos_token_id]
    assert t.turns[1].text == "\n<|im_start|>user\nare you sure? (1)<|im_end|>\n<|im_start|>assistant\n"


class SwiftConstructed(MultiTurnScheduler):
    """A scheduler with ms-swift's constructor shape, forwarding its arguments positionally."""

    def __init__(self, infer_engine=None, max_turns=None, *args, **kwargs):
        super().__init__(infer_engine, max_turns, *args, **kwargs)
        self.built_with = (infer_engine, max_turns)

    def step(self, infer_request, response_choice, current_turn):
        infer_request.messages.append({"role": "user", "content": "again"})
        return {"infer_request": infer_request}


async def test_ms_swift_constructor_shape_works_through_build_scheduler(tok: Any) -> None:
    from rlcore.rollout import build_scheduler

    sampler = ScriptedSampler(["one", "two", "three"], tok)
    # what `rlcore rollout` and `rlcore train` do with a registered factory and CLI options
    sched = build_scheduler(SwiftConstructed, sampler, tok, max_turns=3, sampling_params=PARAMS)
    assert sched.built_with == (None, 3) and sched.sampler is sampler and sched.tokenizer is tok
    res = await run_rollouts(sched, prompts(tok, 1), num_generations=1, sampling_params=PARAMS, progress=False)
    (t,) = res.trajectories
    assert t.num_turns == 3 and [m["content"] for m in t.messages if m["role"] == "user"][1:] == ["again", "again"]
