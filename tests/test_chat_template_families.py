"""Multi-turn on the original chat templates of the main model families (#29).

TRL ships each family's original template in ``trl/chat_templates/*.jinja``; they are read from the
installed TRL at run time (never copied here) and put on SmolLM2's real tokenizer. For every text
template, a model that thinks before it answers plays three turns against a scheduler that asks
again, the way the trainer sets a run up (:func:`rlcore.chat_template.prepare_multi_turn`,
``multi_turn_mode="auto"``). Then, checked independently of the rollout engine, on the rows the
trainer really packs: each trained run of tokens is one sampler completion verbatim after exactly
the prompt the sampler was given, and each row's prompt is the template's rendering of the
conversation before one of its assistant turns (:func:`assert_rows_are_sampler_calls`).

Where a family's template rewrites the history (earlier ``<think>`` blocks dropped), the run
renders with the family's prefix-preserving training template or ``preserve_thinking`` when one
exists, else the turn is a sample of its own; the expected choice per family is pinned below, so a
TRL release that changes a template shows here.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
from pathlib import Path
from typing import Any

import pytest

from rlcore.chat_template import (chat_template_override, generic_assistant_closing, prepare_multi_turn,
                                  set_chat_template_kwargs)
from rlcore.rollout import MultiTurnScheduler, check_batch, encode_prompt, run_rollouts
from rlcore.testing import ScriptedSampler
from rlcore.testing.multi_turn import RecordingSampler, assert_rows_are_sampler_calls
from rlcore.types import Prompt, SamplingParams

pytestmark = pytest.mark.real_model


def _template_dir() -> Path:
    import trl

    return Path(trl.__file__).parent / "chat_templates"


def _originals() -> list[str]:
    return sorted(p.stem for p in _template_dir().glob("*.jinja") if not p.stem.endswith("_training"))


#: how ``auto`` makes each family's template work, as TRL 1.16 ships them: ``append`` (it appends
#: as it is), ``training`` (TRL's training template), ``preserve`` (``preserve_thinking``),
#: ``per_turn`` (samples of their own where it rewrites the history)
EXPECTED = {
    "deepseek_r1_distill": "training", "qwen3": "training", "qwen3_5_think": "training", "qwen3_5_nothink": "training",
    "lfm2_2_5": "preserve", "lfm2_2_5_v2": "preserve", "qwen3_6": "preserve",
    "deepseekv3": "per_turn", "glm4moe": "per_turn", "gptoss": "per_turn",
    "nemotron_3_5_lightning": "per_turn", "nemotron_3_nano": "per_turn", "nemotron_3_super": "per_turn",
    "nemotron_3_ultra": "per_turn",
}
#: image-text templates: their messages are lists of content blocks, not text
MULTIMODAL = {"idefics3", "llava_next", "smolvlm", "lfm2_2_5_vl"}
#: channel formats rlcore has no reader for: none left (gpt-oss's harmony and muse-glimmer's ATEM
#: replies are read into the message fields their templates render back: the reply forms)
CHANNELS: set[str] = set()


class AskAgain(MultiTurnScheduler):
    def step(self, infer_request, response_choice, current_turn):
        infer_request.messages.append({"role": "user", "content": f"Not yet ({current_turn}). Think again."})
        return {"infer_request": infer_request}


def _after_generation_prompt(head: str, full: str) -> str:
    """What a model samples after the generation prompt ``head`` for a message the template renders
    as ``full`` after another opening: the rest of ``full`` past what both share, and where the
    generation prompt opened a reasoning block the rendered call has not (DeepSeek-V3 renders a call
    right after its assistant tag), the block's closing first."""
    shared = os.path.commonprefix([head, full])
    opened = head[len(shared):]
    cut = shared.rfind("<")
    if cut >= 0 and ">" not in shared[cut:]:  # the shared part ends inside a tag: both differ from it on
        shared, opened = shared[:cut], head[cut:]
    if opened.strip() == "<think>":
        return "</think>" + full[len(shared):]
    return full[len(shared):]


def _family_reply(tok: Any, given: str, reasoning: str, answer: str) -> str:
    """What a model of the family that thinks before it answers samples after the prompt ``given``:
    what the family's template renders after the generation prompt for a reasoning-then-answer
    message (so a channel header such as `` to=user<|message|>`` and the rest of the family's
    format are there), or, where the template would not show the reasoning of its last message,
    the text itself (after the part of it the generation prompt opened); in a non-thinking mode
    (the prompt closes an empty reasoning block) the answer alone."""
    if re.search(r"</think>\s*$", given):
        return answer
    closing = generic_assistant_closing(tok)
    text = f"<think>\n{reasoning}\n</think>\n\n{answer}"
    user = [{"role": "user", "content": "q"}]
    head = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    for shape in ({"thinking": reasoning, "content": answer}, {"reasoning_content": reasoning, "content": answer},
                  {"content": text}):
        full = tok.apply_chat_template(user + [{"role": "assistant", **shape}], tokenize=False)
        body = full[len(head):] if full.startswith(head) else ""
        if reasoning in body and body.endswith(closing):
            return body[:len(body) - len(closing)]
    if given.rstrip().endswith("<think>"):  # the generation prompt opened the block itself
        return text[len("<think>\n"):] if given.endswith("\n") else text[len("<think>"):]
    return text


def _thinking(tok: Any) -> ScriptedSampler:
    def respond(prompt_ids: list[int], params: Any, index: int) -> str:
        given = tok.decode(prompt_ids)
        k = given.count("Think again") + 1
        return _family_reply(tok, given, f"Turn {k}: the answer is {k + 40}?", f"My answer is {k + 40}.")

    return ScriptedSampler(tokenizer=tok, respond=respond)


def _family_tokenizer(base: Any, family: str) -> Any:
    """SmolLM2's tokenizer under ``family``'s original template, its end-of-message token the
    family's (a special token and the eos, as in that family's own tokenizer), so the scripted
    model ends its replies the way that family's models do."""
    tok = copy.deepcopy(base)
    tok.chat_template = (_template_dir() / f"{family}.jinja").read_text()
    set_chat_template_kwargs(tok, None)
    end = re.match(r"\s*(<[^<>\s]+>)", generic_assistant_closing(tok))
    if end is not None:
        tok.add_special_tokens({"additional_special_tokens": [end.group(1)]})
        tok.eos_token = end.group(1)
    return tok


def test_every_original_text_template_is_covered() -> None:
    names = set(_originals())
    assert len(names - MULTIMODAL) >= 30, sorted(names)
    assert set(EXPECTED) <= names, sorted(set(EXPECTED) - names)


@pytest.mark.parametrize("family", [n for n in _originals() if n not in MULTIMODAL])
def test_three_thinking_turns_train_exactly(smollm2_tokenizer: Any, family: str) -> None:
    tok = _family_tokenizer(smollm2_tokenizer, family)
    note = prepare_multi_turn(tok, "auto")
    want = EXPECTED.get(family, "append")
    assert note.startswith("auto: a sample per turn" if want == "per_turn" else "auto: one sequence per episode"), note
    assert ("training template" in note) == (want == "training") and ("preserve_thinking" in note) == (want == "preserve")
    assert (chat_template_override(tok) is not None) == (want == "training")

    sampler = RecordingSampler(_thinking(tok))
    msgs = [{"role": "user", "content": "What is 6 times 7? Think first."}]
    res = asyncio.run(run_rollouts(AskAgain(sampler, tokenizer=tok, max_turns=3), [Prompt(msgs, encode_prompt(tok, msgs))],
                                   num_generations=2, sampling_params=SamplingParams(max_tokens=64), progress=False))
    if family in CHANNELS:
        assert all(t.status == "failed" and ("ChatTemplateError" in t.reason or "invariant violated" in t.reason)
                   for t in res.trajectories), [t.reason for t in res.trajectories]
        return
    assert all(t.status == "ok" and t.num_turns == 3 for t in res.trajectories), [t.reason for t in res.trajectories]
    assert not check_batch(res.trajectories, tok)
    rows = assert_rows_are_sampler_calls(res.trajectories, sampler.records, tok)
    # one sequence per episode where the template appends; else a sample at each rewritten turn
    assert (rows == 2) == (want != "per_turn"), (family, rows)
    if want == "per_turn":
        assert all(t.has_turn_samples for t in res.trajectories)


def _supports_tools(tok: Any) -> bool:
    from trl.chat_template_utils import supports_tool_calling

    try:
        return bool(supports_tool_calling(tok))
    except Exception:  # noqa: BLE001 - a template TRL's probe cannot render: no tools
        return False


TOOLED = [n for n in _originals() if n not in MULTIMODAL | CHANNELS]
#: a tool-call reply is kept as the tool-call message (content + tool_calls) where the template then
#: renders it exactly as sampled (Gemma 4, DiffusionGemma, gpt-oss, Muse Glimmer), else as its text,
#: else as the tool-call message whose content is the text before the calls (DeepSeek-V3: the closed
#: <think> block), else (Nemotron 3, whose template drops the empty reasoning block the generation
#: prompt opened) a sample of its own. Families whose calls
#: no parser reads would be pinned here (their trajectories must fail, loudly, never train wrong): none
TOOL_GAPS: set[str] = set()


@pytest.mark.parametrize("family", TOOLED)
def test_a_tool_conversation_trains_exactly(smollm2_tokenizer: Any, family: str) -> None:
    """The model calls ``calculator`` in its family's own format (what the template renders for an
    assistant tool call), ``tool_parser="auto"`` finds the call, the tool's answer comes back in a
    tool message, the model answers; every packed row is the sampler's calls verbatim."""
    from rlcore.rollout import ToolScheduler

    tok = _family_tokenizer(smollm2_tokenizer, family)
    if not _supports_tools(tok):
        pytest.skip(f"{family}'s template renders no tools")
    prepare_multi_turn(tok, "auto")
    closing = generic_assistant_closing(tok)
    sched = ToolScheduler(None, tokenizer=tok, max_turns=3)
    user = [{"role": "user", "content": "What is 26 + 9? Use the calculator."}]
    head = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True, tools=sched.tools)
    full = ""
    for arguments in ({"expression": "26 + 9"}, '{"expression": "26 + 9"}'):  # DeepSeek-V3 takes a JSON string
        call = {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": arguments}}]}
        try:
            full = tok.apply_chat_template(user + [call], tokenize=False, tools=sched.tools)
            break
        except Exception:  # noqa: BLE001
            continue
    if not full.startswith(head):  # the call renders after another opening than the generation prompt's
        full = head + _after_generation_prompt(head, full)
    body = full[len(head):]
    # a call message the template closes like any reply ends at the family's end-of-message token
    # (the eos); one it leaves open (Gemma 4's ends in <|tool_response>) ends where the model stops
    closed = body.endswith(closing)
    body = body[:len(body) - len(closing)] if closed else body

    def respond(prompt_ids: list[int], params: Any, index: int) -> str:
        given = tok.decode(prompt_ids)
        if "35" in given[len(head) - 40:]:  # the tool answered: the model thinks, then answers
            return _family_reply(tok, given, "The tool says 35.", "The answer is 35.")
        return body if closed else list(tok.encode(body, add_special_tokens=False))  # ids: no eos after it

    sampler = RecordingSampler(ScriptedSampler(tokenizer=tok, respond=respond))
    sched.sampler = sampler
    res = asyncio.run(run_rollouts(sched, [Prompt(user, encode_prompt(tok, user, tools=sched.tools))], num_generations=2,
                                   sampling_params=SamplingParams(max_tokens=96), progress=False))
    if family in TOOL_GAPS:
        assert all(t.status == "failed" and t.reason for t in res.trajectories if t.status != "ok")
        assert not check_batch([t for t in res.trajectories if t.status == "ok"], tok, tools=sched.tools)
        return
    for t in res.trajectories:
        assert t.status == "ok", (family, t.reason, body)
        assert t.infos.get("tool_calls") == 1 and t.infos.get("tool_errors", 0) == 0, (family, t.infos, body)
        assert any(m.get("role") == "tool" and m.get("content") == "35" for m in t.messages), t.messages
    assert not check_batch(res.trajectories, tok, tools=sched.tools)
    assert_rows_are_sampler_calls(res.trajectories, sampler.records, tok, tools=sched.tools)
