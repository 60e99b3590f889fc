"""Tool calls in each model family's own format (issue 29, item 3): what a family's ORIGINAL chat
template (TRL's ``trl/chat_templates``, read from the installed TRL at run time) renders for an
assistant tool call is parsed back to the same name and arguments; ``auto`` picks the family's
parser from the template; a scripted model's family-format call runs through the tool scheduler
and its answer is in the next turn; ``--tool-parser`` / ``tool_parser``; a plugin's own parser."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import rlcore
from rlcore.data import load_prompts
from rlcore.errors import ConfigError, UnknownComponentError
from rlcore.rollout import ToolManager, ToolScheduler, auto_tool_parser, make_tool_parser, render, run_rollouts
from rlcore.rollout.tool_parsers import trl_template_dir
from rlcore.rollout.tools import calculator
from rlcore.testing import ScriptedSampler
from rlcore.testing.cli_checks import fails_before_model_load
from rlcore.testing.packages import write_site_plugin
from rlcore.types import Completion, SamplingParams, Trajectory

TEMPLATES = trl_template_dir()
pytestmark = pytest.mark.skipif(TEMPLATES is None, reason="TRL's chat templates are not installed")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"},
        "options": {"type": "object"}, "note": {"type": "string"}}}}}
# a string that reads as a number (a template writes strings raw: only the schema tells them apart),
# nested JSON, and text with markup characters
ARGS = {"city": "Paris", "days": 3, "zip": "75001", "options": {"units": ["C", "F"], "hourly": False},
        "note": 'say "hi" <b>&</b>'}

#: template file -> the parser ``auto`` must pick (every other TRL template: hermes)
FAMILY_PARSER = {
    **dict.fromkeys(["qwen2_5", "qwen3", "qwen3_instruct_2507", "qwen3_vl"], "hermes"),
    **dict.fromkeys(["qwen3_5_think", "qwen3_5_nothink", "qwen3_6", "qwen3_8", "nemotron_3_nano", "nemotron_3_super",
                     "nemotron_3_ultra", "nemotron_3_5_lightning"], "qwen3_xml"),
    **dict.fromkeys(["llama3_1", "llama3_2"], "llama3_json"),
    "gptoss": "gptoss",
    **dict.fromkeys(["deepseekv3", "deepseek_r1_distill"], "deepseek_v3"),
    **dict.fromkeys(["gemma4", "gemma4_v2", "gemma4_v3", "gemma4_v4", "gemma4_v5", "diffusion_gemma"], "gemma4"),
    "muse_glimmer": "muse_atem",
    **dict.fromkeys(["glm4moe", "lfm2_v2", "lfm2_2_5", "lfm2_2_5_v2", "lfm2_2_5_vl"], "response_schema"),
}


def with_template(tokenizer: Any, name: str) -> Any:
    """A copy of ``tokenizer`` whose chat template is TRL's ``name.jinja`` (the original text); a deep
    copy, so a test that adds tokens to it leaves the session's shared tokenizer as it was."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    return tok


def rendered_call(tok: Any, calls: list[tuple[str, dict[str, Any]]], tools: list[dict[str, Any]]) -> tuple[str, str]:
    """(prompt, the assistant message's text) as the template renders a message making ``calls``."""
    user = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt = tok.apply_chat_template(user, tools=tools, tokenize=False, add_generation_prompt=True)
    try:
        message = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}
        full = tok.apply_chat_template(user + [message], tools=tools, tokenize=False)
    except Exception:  # noqa: BLE001 - DeepSeek-V3's original template takes the arguments as JSON text
        message = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": n, "arguments": json.dumps(a)}} for n, a in calls]}
        full = tok.apply_chat_template(user + [message], tools=tools, tokenize=False)
    if full.startswith(prompt):
        return prompt, full[len(prompt):]
    if "<｜tool▁calls▁begin｜>" in full:  # DeepSeek-V3 renders a call right after its assistant tag, not after <think>
        at = full.rfind("<｜Assistant｜>") + len("<｜Assistant｜>")
        return full[:at], full[at:]
    # Nemotron 3 renders the history differently once the assistant answered: take its last message
    head, sep, text = full.rpartition("<|im_start|>assistant\n")
    assert sep, f"cannot find the assistant message in {full[-300:]!r}"
    return head + sep, text


# DeepSeek-R1-distill's template shows DeepSeek's call format but drops the calls of a message with content
@pytest.mark.parametrize("template", sorted(n for n in FAMILY_PARSER if n not in ("qwen2_5", "qwen3_vl", "deepseek_r1_distill")))
def test_the_parser_reads_back_what_the_original_template_renders(tiny_tokenizer: Any, template: str) -> None:
    tok = with_template(tiny_tokenizer, template)
    assert auto_tool_parser(tok)[0] == FAMILY_PARSER[template]
    prompt, text = rendered_call(tok, [("get_weather", ARGS)], [WEATHER])
    parser = make_tool_parser("auto", tok)
    calls = parser.parse(text, tools=[WEATHER], prompt=prompt)
    assert [(c.name, c.arguments, c.error) for c in calls] == [("get_weather", ARGS, None)], text


@pytest.mark.parametrize("template", ["qwen3", "qwen3_5_nothink", "qwen3_6", "deepseekv3", "gemma4", "diffusion_gemma",
                                      "muse_glimmer"])
def test_several_calls_in_one_message_come_back_in_order(tiny_tokenizer: Any, template: str) -> None:
    tok = with_template(tiny_tokenizer, template)
    two = [("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Lima", "days": 2})]
    _, text = rendered_call(tok, two, [WEATHER])
    calls = make_tool_parser("auto", tok).parse(text, tools=[WEATHER])
    assert [(c.name, c.arguments) for c in calls] == two


def test_gptoss_reads_the_harmony_form_the_model_writes() -> None:
    """gpt-oss itself puts the recipient after the channel and constrains the content type; an
    analysis message may come first; ``<|call|>`` is the stop token a sampler drops."""
    parser = make_tool_parser("gptoss")
    text = ('<|channel|>analysis<|message|>Need weather; to=functions.nothing here<|end|>'
            '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
            + json.dumps(ARGS))
    assert [(c.name, c.arguments) for c in parser.parse(text)] == [("get_weather", ARGS)]
    assert parser.parse("<|channel|>final<|message|>It is sunny.<|return|>") == []
    assert parser.parse("<|channel|>commentary<|message|>Checking the weather…<|end|>") == []


@pytest.mark.parametrize("reply", [
    ' to=functions.calculator<|channel|>commentary json<|message|>{"expression": "26 + 9"}<|call|>',
    '<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant to=functions.calculator<|channel|>commentary json'
    '<|message|>{"expression": "26 + 9"}<|call|>',
    "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>35<|return|>",
    "<|channel|>final<|message|>35<|return|>",
])
def test_gptoss_replies_become_messages_its_template_renders_back(tiny_tokenizer: Any, reply: str) -> None:
    """``message()`` is the structured form the gpt-oss template needs (it renders a tool's answer
    only after an assistant message with ``tool_calls``): rendered, it gives back the reply."""
    tok = with_template(tiny_tokenizer, "gptoss")
    user = [{"role": "user", "content": "26 + 9?"}]
    gen = tok.apply_chat_template(user, tools=[WEATHER], tokenize=False, add_generation_prompt=True)
    message = make_tool_parser("gptoss").message(reply)
    assert tok.apply_chat_template(user + [message], tools=[WEATHER], tokenize=False) == gen + reply
    with_answer = user + [message, {"role": "tool", "content": "35"}]
    if "tool_calls" in message:
        assert tok.apply_chat_template(with_answer, tools=[WEATHER], tokenize=False).endswith(
            '<|start|>functions.calculator to=assistant<|channel|>commentary<|message|>"35"<|end|>')


def test_llama3_json_answers_are_not_calls() -> None:
    parser = make_tool_parser("llama3")  # the alias
    assert parser.name == "llama3_json"
    assert parser.parse("The answer is 35.") == []
    assert parser.parse('{"answer": 35}') == []  # a JSON answer names no function
    calls = parser.parse('<|python_tag|>{"name": "calculator", "parameters": {"expression": "1+1"}}; '
                         '{"name": "calculator", "arguments": "{\\"expression\\": \\"2+2\\"}"}')
    assert [(c.name, c.arguments) for c in calls] == [("calculator", {"expression": "1+1"}), ("calculator", {"expression": "2+2"})]


@pytest.mark.parametrize("parser, text", [
    ("qwen3_xml", "<tool_call>\n<function=calculator\n<parameter=expression>\n1+1\n</parameter>\n</tool_call>"),
    ("qwen3_xml", "<tool_call>\ncalculator(1+1)\n</tool_call>"),
    ("qwen3_xml", "<tool_call>\n<function=calculator>\n<parameter=expression>\n1+1\n</parameter>junk\n</function>\n</tool_call>"),
    ("llama3_json", '{"name": "calculator", "parameters": {"expression": "1+1"'),
    ("llama3_json", '{"name": "calculator", "parameters": [1, 2]}'),
    ("gptoss", '<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>{oops<|call|>'),
    ("gptoss", '<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>[1]<|call|>'),
    ("gptoss", '<|channel|>commentary to=functions. <|constrain|>json<|message|>{}<|call|>'),
    ("deepseek_v3", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n```json\n{"expression": "1+1"}\n```'),
    ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calculator(1+1)<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    ("deepseek_v3", '<｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n```json\n{"expression": "1+1"\n```<｜tool▁call▁end｜>'),
    ("deepseek_v3", '<｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n```json\n{"expression": "1+1"}<｜tool▁call▁end｜>'),
    ("deepseek_v3", '<｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n```json\n[1]\n```<｜tool▁call▁end｜>'),
    ("deepseek_v3", '<｜tool▁call▁begin｜>my calc<｜tool▁sep｜>{"expression": "1+1"}<｜tool▁call▁end｜>'),
    ("gemma4", '<|tool_call>call:calculator{expression:<|"|>1+1}<tool_call|>'),
    ("gemma4", "<|tool_call>call:calculator{expression:one plus one}<tool_call|>"),
    ("gemma4", '<|tool_call>call:{expression:<|"|>1+1<|"|>}<tool_call|>'),
    ("gemma4", '<|tool_call>calculator{expression:<|"|>1+1<|"|>}<tool_call|>'),
    ("gemma4", '<|tool_call>call:calculator{expression:<|"|>1+1<|"|>} and more<tool_call|>'),
    ("gemma4", '<|tool_call>call:calculator{expression:<|"|>1+1<|"|> x:1}<tool_call|>'),
    ("gemma4", "<|tool_call>call:calculator{expression:" + "[" * 100 + "<tool_call|>"),
    ("muse_atem", '<atem:function_calls>\n<atem:invoke name="calculator">\n<atem:parameter name="expression">1+1'
                  "</atem:function_calls>"),
    ("muse_atem", '<atem:function_calls>\n<atem:invoke name="calculator">\n<atem:parameter name="expression">1+1'
                  "</atem:parameter>\n</atem:function_calls>"),
    ("muse_atem", '<atem:function_calls>\n<atem:invoke name="calculator">\nexpression: 1+1\n</atem:invoke>\n'
                  "</atem:function_calls>"),
    ("muse_atem", '<atem:function_calls>\n<atem:invoke>\n<atem:parameter name="expression">1+1</atem:parameter>\n'
                  "</atem:invoke>\n</atem:function_calls>"),
    ("muse_atem", "<atem:function_calls>\ncalculator(1+1)\n</atem:function_calls>"),
])
async def test_a_garbled_call_is_answered_like_hermes_answers_one(parser: str, text: str) -> None:
    manager = ToolManager([calculator], parser=make_tool_parser(parser))
    replies = await manager.run(text)
    assert len(replies) == 1 and replies[0]["content"].startswith("Error: invalid tool call "), replies
    hermes = await ToolManager([calculator]).run("<tool_call>{oops}</tool_call>")
    assert hermes[0]["content"].startswith("Error: invalid tool call ")


def test_deepseek_v3_reads_both_of_its_call_forms_and_only_calls() -> None:
    """V3 (and R1): ``function<｜tool▁sep｜>NAME`` and fenced JSON; V3.1: ``NAME<｜tool▁sep｜>{…}``; text
    before the calls, a missing ``<｜tool▁calls▁end｜>`` (the sampler stopped) and answers are fine."""
    parser = make_tool_parser("deepseekv3")  # the alias
    assert parser.name == "deepseek_v3"
    v3 = ('I will look it up.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
          + json.dumps(ARGS) + '\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```\n'
          '{"city": "Oslo"}\n```<｜tool▁call▁end｜>')
    assert [(c.name, c.arguments) for c in parser.parse(v3)] == [("get_weather", ARGS), ("get_weather", {"city": "Oslo"})]
    v31 = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Lima"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    assert [(c.name, c.arguments) for c in parser.parse(v31)] == [("get_weather", {"city": "Lima"})]
    assert parser.parse("It is sunny in Paris.") == []
    after = v31 + "<｜tool▁call▁begin｜>not a call: after the calls ended"
    assert [c.name for c in parser.parse(after)] == ["get_weather"]


@pytest.mark.parametrize("written, args", [
    ('{city:<|"|>Paris<|"|>}', {"city": "Paris"}),
    ('{n:-3,x:2.5,big:1e+20,small:1e-05,yes:true,no:false,none:null}',
     {"n": -3, "x": 2.5, "big": 1e20, "small": 1e-05, "yes": True, "no": False, "none": None}),
    ('{ note : <|"|>a {b}: [c], "d" <e><|"|> , deep:{a:[{b:[]}],c:{}} }', {"note": 'a {b}: [c], "d" <e>', "deep": {"a": [{"b": []}], "c": {}}}),
    ('{<|"|>quoted key<|"|>:1}', {"quoted key": 1}),
    ("{}", {}),
])
def test_gemma4_reads_its_object_notation(written: str, args: dict[str, Any]) -> None:
    """Gemma's own notation, typed by the text (bare keys, ``<|"|>`` strings written raw, numbers as
    Python prints them, ``null`` as DiffusionGemma writes ``None``), around thinking and content."""
    text = f'<|channel>thought\nCall it.<channel|><|tool_call>call:get_weather{written}<tool_call|><|tool_response>'
    assert [(c.name, c.arguments, c.error) for c in make_tool_parser("gemma4").parse(text)] == [("get_weather", args, None)]
    assert make_tool_parser("gemma4").parse("<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}") == []  # never closed


def test_muse_atem_types_values_by_the_schema_and_reads_several_invokes() -> None:
    parser = make_tool_parser("atem")  # the alias
    text = ('<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter name="city"> Paris </atem:parameter>\n'
            '<atem:parameter name="days">3</atem:parameter>\n<atem:parameter name="zip">75001</atem:parameter>\n'
            '<atem:parameter name="options">{"units": ["C"]}</atem:parameter>\n</atem:invoke>\n'
            '<atem:invoke name="get_weather">\n<atem:parameter name="city">Lima</atem:parameter>\n</atem:invoke>\n'
            "</atem:function_calls>")
    calls = parser.parse(text, tools=[WEATHER])
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", {"city": " Paris ", "days": 3, "zip": "75001", "options": {"units": ["C"]}}),  # spaces kept
        ("get_weather", {"city": "Lima"})]
    assert parser.parse(text)[0].arguments["zip"] == 75001  # no schema: JSON where it parses
    assert parser.parse('<atem:function_calls>\n<atem:invoke name="x">') == []  # the block never closed


@pytest.mark.parametrize("reply", [
    ' to=get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter name="city">Paris'
    '</atem:parameter>\n<atem:parameter name="days">3</atem:parameter>\n<atem:parameter name="note">2.50</atem:parameter>\n'
    '<atem:parameter name="options">{"hourly": false}</atem:parameter>\n</atem:invoke>\n</atem:function_calls>',
    ' to=self<|message|>Look it up.<|eom|><|start|>assistant to=get_weather<|message|><atem:function_calls>\n'
    '<atem:invoke name="get_weather">\n<atem:parameter name="city">Paris</atem:parameter>\n</atem:invoke>\n</atem:function_calls>',
    " to=self<|message|>Easy.<|eom|><|start|>assistant to=user<|message|>It is sunny.",
    " to=user<|message|>It is sunny.",
])
def test_muse_glimmer_replies_become_messages_its_template_renders_back(tiny_tokenizer: Any, reply: str) -> None:
    """The ``atem`` reply form: a Muse Glimmer reply read into ``reasoning_content``, ``content`` and
    ``tool_calls`` renders back, after the generation prompt, as exactly the reply (values typed
    only where they are written back the same: ``2.50`` stays text)."""
    from rlcore.chat_template import assistant_form
    from rlcore.rollout.tool_parsers import atem_message

    tok = with_template(tiny_tokenizer, "muse_glimmer")
    assert assistant_form(tok, [WEATHER])[0] == "atem"
    user = [{"role": "user", "content": "Weather in Paris?"}]
    gen = tok.apply_chat_template(user, tools=[WEATHER], tokenize=False, add_generation_prompt=True)
    message = atem_message(reply)
    follow = [{"role": "tool", "content": "sunny"}] if "tool_calls" in message else []
    full = tok.apply_chat_template(user + [message] + follow, tools=[WEATHER], tokenize=False)
    assert full.startswith(gen + reply + "<|eot|>"), full[len(gen):]
    if "tool_calls" in message:
        assert message["content"] == "" and message["tool_calls"][0]["function"]["arguments"]["city"] == "Paris"
    assert atem_message("no header at all") == {"role": "assistant", "content": "no header at all"}


def test_auto_picks_the_family_parser_of_every_trl_template(tiny_tokenizer: Any) -> None:
    seen = {}
    for path in sorted(TEMPLATES.glob("*.jinja")):
        family = path.stem.removesuffix("_training")
        tok = with_template(tiny_tokenizer, path.stem)
        seen[path.stem] = auto_tool_parser(tok)[0]
        assert seen[path.stem] == FAMILY_PARSER.get(family, "hermes"), (path.stem, auto_tool_parser(tok))
    assert {"gptoss_training", "qwen3_5_think_training", "llama3_1"} <= set(seen)  # the ones the seeds use, read
    assert auto_tool_parser(tiny_tokenizer)[0] == "hermes"  # a plain ChatML template


def test_auto_reads_templates_that_are_not_trls_copy_and_the_tokenizers_own_schema(tiny_tokenizer: Any) -> None:
    tok = with_template(tiny_tokenizer, "qwen3_5_nothink")
    tok.chat_template += "{#- a local edit #}"
    assert auto_tool_parser(tok)[0] == "qwen3_xml"
    tok = with_template(tiny_tokenizer, "gptoss")
    tok.chat_template = tok.chat_template.replace("# Valid channels", "# Channels")
    assert auto_tool_parser(tok)[0] == "gptoss"
    own = with_template(tiny_tokenizer, "qwen3")
    own.response_template = {"defaults": {"role": "assistant"}, "fields": {"content": {"content": "text"}}}
    assert auto_tool_parser(own) == ("response_schema", "the tokenizer's own response template")
    assert getattr(with_template(tiny_tokenizer, "glm4moe"), "response_template", None) is None  # probing changed nothing


def test_response_schema_without_one_is_one_line(tiny_tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match=r"has no response template and TRL knows none .* pick another tool_parser"):
        make_tool_parser("response_schema", tiny_tokenizer)


def _scripted(tok: Any, *texts: str, eos: bool = True) -> ScriptedSampler:
    return ScriptedSampler(list(texts), tok, append_eos=eos)


XML_CALL = "<tool_call>\n<function=calculator>\n<parameter=expression>\n26 + 9\n</parameter>\n</function>\n</tool_call>"
LLAMA_CALL = '{"name": "calculator", "parameters": {"expression": "26 + 9"}}'


@pytest.mark.parametrize("template, call, think", [
    ("qwen3_5_nothink", XML_CALL, ""),
    ("qwen3_5_think", XML_CALL, "The user wants 26 + 9: use the calculator.\n</think>\n\n"),  # the seeds' template
    ("qwen3_6", XML_CALL, "Use the tool.\n</think>\n\n"),
    ("llama3_1", LLAMA_CALL, ""),
    ("llama3_2", LLAMA_CALL, ""),
    ("qwen3_instruct_2507", '<tool_call>\n{"name": "calculator", "arguments": {"expression": "26 + 9"}}\n</tool_call>', ""),
])
async def test_a_family_format_call_runs_and_its_answer_is_in_the_next_turn(tiny_tokenizer: Any, template: str,
                                                                            call: str, think: str) -> None:
    tok = with_template(tiny_tokenizer, template)
    sampler = _scripted(tok, think + call, ("It is 35.\n</think>\n\n" if think else "") + "35")
    sched = ToolScheduler(sampler, max_turns=4)  # tool_parser: auto
    prompts = load_prompts([{"question": "What is 26 + 9?"}], tok, tools=sched.tools)
    res = await run_rollouts(sched, prompts, sampling_params=SamplingParams(max_tokens=80), progress=False)
    t = res.trajectories[0]
    assert t.status == "ok", t.reason
    assert t.infos["tool_calls"] == 1 and t.infos["tool_errors"] == 0
    assert t.messages[2]["role"] == "tool" and t.messages[2]["content"] == "35"
    # the next turn's prompt: the call as the model wrote it, then the template's tool message holding
    # the answer and the generation prompt (everything the template adds after the assistant message)
    second_prompt = tok.decode(sampler.calls[1][0], skip_special_tokens=False)
    before = render(tok, t.messages[:2], tools=sched.tools)
    answer = render(tok, t.messages[:3], add_generation_prompt=True, tools=sched.tools)[len(before):]
    assert "35" in answer and second_prompt.endswith(answer)
    assert call in second_prompt.removesuffix(answer)


async def test_a_gptoss_call_is_found_and_executed(tiny_tokenizer: Any) -> None:
    """The scheduler runs a harmony call and answers it. (Rendering the answer back needs the call
    as a structured ``tool_calls`` message, which the token stream does not build yet.)"""
    tok = with_template(tiny_tokenizer, "gptoss")
    sched = ToolScheduler(_scripted(tok, "x"), tokenizer=tok)
    assert sched.tool_parser.name == "gptoss"
    text = '<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>{"expression": "26 + 9"}<|call|>'
    traj = Trajectory(prompt_ids=[1], messages=[{"role": "user", "content": "26 + 9?"}, {"role": "assistant", "content": text}])
    done = sched.check_finished(traj, _choice(sched, text), 1)
    out = await sched.step(traj, _choice(sched, text), 1)
    assert not done and out["infer_request"].messages[2] == {"role": "tool", "name": "calculator", "content": "35"}
    assert traj.infos["tool_calls"] == 1 and traj.infos["tool_errors"] == 0


def _choice(sched: ToolScheduler, text: str) -> Any:
    from rlcore.rollout import ResponseChoice

    ids = list(sched.tokenizer.encode(text, add_special_tokens=False))
    return ResponseChoice(Completion(token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason="stop", text=text), sched.tokenizer)


def test_an_explicit_parser_wins_over_auto_and_a_wrong_name_is_one_line(tiny_tokenizer: Any) -> None:
    tok = with_template(tiny_tokenizer, "qwen3")
    assert ToolScheduler(_scripted(tok, "x"), tokenizer=tok, tool_parser="qwen3_coder").tool_parser.name == "qwen3_xml"
    with pytest.raises(UnknownComponentError, match=r"no tool_parser named 'hermez'; available: .*hermes"):
        ToolScheduler(_scripted(tok, "x"), tokenizer=tok, tool_parser="hermez")


def test_the_config_field_reaches_the_tool_scheduler(tiny_tokenizer: Any) -> None:
    from rlcore.training.components import make_scheduler
    from rlcore.training.config import GRPOConfig, validate_components

    args = GRPOConfig(output_dir="unused", scheduler="tool_scheduler", tool_parser="llama3", report_to="none")
    sched = make_scheduler(args, _scripted(tiny_tokenizer, "x"), tiny_tokenizer)
    assert sched.tool_parser.name == "llama3_json"
    args = GRPOConfig(output_dir="unused", scheduler="tool_scheduler", report_to="none",
                      scheduler_options={"tool_parser": "gptoss"})
    assert make_scheduler(args, _scripted(tiny_tokenizer, "x"), tiny_tokenizer).tool_parser.name == "gptoss"
    with pytest.raises(UnknownComponentError, match="no tool_parser named 'xml'"):
        validate_components(GRPOConfig(output_dir="unused", tool_parser="xml", report_to="none"))


def test_rlcore_train_refuses_an_unknown_tool_parser_before_the_model_loads(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    err = fails_before_model_load(["--scheduler", "tool_scheduler", "--tool-parser", "qwen_xml"], capsys, monkeypatch)
    assert err.startswith("Error: no tool_parser named 'qwen_xml'; available: ") and "qwen3_xml" in err


def test_rlcore_rollout_refuses_an_unknown_tool_parser_before_the_model_loads(capsys: Any, monkeypatch: pytest.MonkeyPatch,
                                                                               tmp_path: Path) -> None:
    import transformers

    from rlcore.commands.cli import main

    def no_load(*a: Any, **k: Any) -> Any:  # fault injection: loading a model here is the bug
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    with pytest.raises(SystemExit) as exc:
        main(["rollout", "--scheduler", "tool_scheduler", "--tool-parser", "llama4", "--output", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.startswith("Error: no tool_parser named 'llama4'; available: ") and "\n" not in err


BRACKET_PLUGIN = '''
import rlcore
from rlcore import ToolCall, ToolParser


class BracketParser(ToolParser):
    """[[NAME|{json}]]"""

    name = "bracket"

    def parse(self, text):
        import json

        out = []
        for chunk in text.split("[[")[1:]:
            name, _, rest = chunk.partition("|")
            body = rest.partition("]]")[0]
            try:
                out.append(ToolCall(name, json.loads(body)))
            except ValueError as exc:
                out.append(ToolCall("", {}, error=f"invalid tool call {chunk[:40]!r}: {exc}"))
        return out


@rlcore.hookimpl
def register_tool_parsers(register):
    register("bracket", BracketParser)
'''


@pytest.fixture
def bracket_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A third-party tool parser, installed as an installer would (module + dist-info)."""
    site = write_site_plugin(tmp_path / "site", "rl-plugin-bracket", "bracket_parser_plugin", BRACKET_PLUGIN)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("RLCORE_PLUGINS", "rl-plugin-bracket")
    rlcore.reload_plugins()
    yield
    monkeypatch.undo()
    rlcore.reload_plugins()


async def test_a_plugin_registers_its_own_tool_parser(bracket_plugin: None, tiny_tokenizer: Any, capsys: Any) -> None:
    from rlcore.commands.cli import main

    main(["components", "tool_parser"])
    assert capsys.readouterr().out.strip().startswith(
        "tool_parser: bracket, deepseek_v3 (alias deepseekv3), gemma4, gptoss (alias harmony), hermes, ")
    sampler = _scripted(tiny_tokenizer, '[[calculator|{"expression": "6*7"}]]', "42")
    sched = ToolScheduler(sampler, max_turns=3, tool_parser="bracket")
    prompts = load_prompts([{"question": "6*7?"}], tiny_tokenizer, tools=sched.tools)
    res = await run_rollouts(sched, prompts, sampling_params=SamplingParams(max_tokens=60), progress=False)
    t = res.trajectories[0]
    assert t.status == "ok" and t.messages[2] == {"role": "tool", "name": "calculator", "content": "42"}


@pytest.mark.parametrize("arguments, one_sequence", [
    ('{"expression": "26 + 9"}', True),  # as the template writes JSON: the call message renders back as sampled
    ('{"expression":"26 + 9"}', False),  # compact JSON renders otherwise: the turn after the call is a sample of its own
])
async def test_a_deepseek_v3_call_after_reasoning_appends_as_a_tool_call_message(tiny_tokenizer: Any, arguments: str,
                                                                                  one_sequence: bool) -> None:
    """DeepSeek-V3's original template renders a reply's text without its reasoning but a tool-call
    message's content verbatim: the reply (``<think>`` opened by the generation prompt, reasoning,
    ``</think>``, the calls) is kept as the tool-call message whose content is the reasoning block,
    and the conversation goes on as one sequence; where the arguments are not written as the
    template writes them, the turn after the call is a sample of its own. Exact either way."""
    from rlcore.rollout import check_batch

    tok = with_template(tiny_tokenizer, "deepseekv3")
    tok.add_special_tokens({"additional_special_tokens": ["<｜end▁of▁sentence｜>"]})
    tok.eos_token = "<｜end▁of▁sentence｜>"
    call = ("I need the calculator.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n"
            f"```json\n{arguments}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    sampler = _scripted(tok, call, "<think>\nThe tool said 35.\n</think>\n\n35")
    sched = ToolScheduler(sampler, max_turns=3)
    assert sched.tool_parser.name == "deepseek_v3"
    prompts = load_prompts([{"question": "What is 26 + 9?"}], tok, tools=sched.tools)
    res = await run_rollouts(sched, prompts, sampling_params=SamplingParams(max_tokens=400), progress=False)
    t = res.trajectories[0]
    assert t.status == "ok", t.reason
    assert t.infos["tool_calls"] == 1 and t.messages[2]["content"] == "35"
    assert not check_batch(res.trajectories, tok, tools=sched.tools)
    assert t.has_turn_samples == (not one_sequence)
    if one_sequence:
        assert t.messages[1]["content"] == "<think>\nI need the calculator.\n</think>\n\n"
        assert t.messages[1]["tool_calls"][0]["function"] == {"name": "calculator", "arguments": arguments}
        first, second = (tok.decode(ids, skip_special_tokens=False) for ids, *_ in sampler.calls)
        assert second.startswith(first + call + "<｜end▁of▁sentence｜>")  # the sampled call, then only appended text
