"""Issue 35 item 12: scheduler options and prompt messages are checked as strictly as their
neighbours (sampler options, a ``prompt: 12345``) — refused in one line before the model loads."""

from __future__ import annotations

import json

import pytest

from rlcore.commands.cli import main
from rlcore.errors import ConfigError, DatasetError
from rlcore.testing.cli_checks import fails_before_model_load
from rlcore.data.cursor import check_columns


# --- scheduler_options ---------------------------------------------------------------------------------
def test_an_unknown_scheduler_options_key_is_one_line_listing_what_the_scheduler_accepts(capsys, monkeypatch, tmp_path):
    err = fails_before_model_load(["--scheduler_options", '{"max_turns": 1, "max_trun": 3}',
                                   "--output_dir", str(tmp_path / "o")], capsys, monkeypatch)
    assert err == ("Error: scheduler_options has max_trun, which scheduler 'default' does not declare; it accepts: "
                   "max_total_tokens, max_turns, tools")


def test_known_scheduler_options_still_reach_the_scheduler(tmp_path):
    from rlcore.commands.train import build_plan

    plan = build_plan(["--scheduler", "multi_turn", "--scheduler_options", '{"max_total_tokens": 64}',
                       "--output_dir", str(tmp_path / "o")])
    assert plan.args.scheduler_options == {"max_total_tokens": 64}


def test_grpo_trainer_refuses_an_unknown_scheduler_option_before_the_model_loads(tmp_path):
    from rlcore import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path / "o"), reward_funcs=["digits"], scheduler_options={"bogus": 1},
                      per_device_train_batch_size=2, num_generations=2)
    with pytest.raises(ConfigError, match=r"^scheduler_options has bogus, which scheduler 'default' does not declare"):
        GRPOTrainer("no/such-model-is-loaded", args=args, train_dataset=[{"prompt": "hi"}])


def test_rlcore_rollout_refuses_an_unknown_scheduler_options_key_before_the_model_loads(capsys, monkeypatch, tmp_path):
    import transformers

    def no_load(*a, **k):  # fault injection: loading a model here is the bug
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    with pytest.raises(SystemExit) as exc:
        main(["rollout", "--scheduler-options", '{"bogus": 1}', "--output", str(tmp_path / "r.jsonl")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == "Error: unknown option --bogus: scheduler 'default' accepts --max-total-tokens, --max-turns, --tools"


# --- messages of a conversational prompt -------------------------------------------------------------------
GOOD = {"role": "user", "content": "What is 2 + 2?"}


@pytest.mark.parametrize("bad, problem", [
    ({"role": "user"}, "message 1 (role 'user') has no content; give it its text (only an assistant message with "
                       "tool_calls may go without)"),
    ({"role": "user", "content": None}, "message 1 (role 'user') has content null; give it its text"),
    ({"role": "assistant", "content": None}, "message 1 (role 'assistant') has content null"),
    ({"role": "wizard", "content": "abracadabra"}, "message 1 has role 'wizard'; a message's role is one of system, "
                                                   "developer, user, assistant, tool, function, ipython"),
    ({"role": "user", "content": 12345}, "message 1 (role 'user') has content 12345 (int); content is text or a list "
                                          "of content parts"),
    ({"role": "user", "content": {"text": "hi"}}, "message 1 (role 'user') has content {'text': 'hi'} (dict)"),
    ({"role": "user", "content": ["hi"]}, "message 1 (role 'user') has content part 0 'hi'"),
])
def test_a_prompt_message_that_would_train_on_an_invented_turn_is_refused_with_its_row(bad, problem, tmp_path,
                                                                                      capsys, monkeypatch):
    data = tmp_path / "chat.jsonl"
    rows = [{"prompt": [GOOD]}, {"prompt": [GOOD]}, {"prompt": [GOOD, bad]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    err = fails_before_model_load(["--dataset", str(data), "--reward", "length_penalty",
                                   "--output_dir", str(tmp_path / "o")], capsys, monkeypatch)
    assert err.startswith(f"Error: dataset {data}: dataset row 2 column 'prompt': {problem}"), err


def test_a_messages_column_is_checked_too_and_so_is_a_python_dataset():
    with pytest.raises(DatasetError, match=r"^train_dataset: dataset row 0 column 'messages': message 0 has role 'bot'"):
        check_columns([{"messages": [{"role": "bot", "content": "hi"}]}], source="train_dataset")


def test_the_valid_message_shapes_stay_valid():
    """Tool calls without content, multimodal content lists, tool results, system and developer roles."""
    call = {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'}}
    rows = [
        {"prompt": [{"role": "system", "content": "Be brief."}, GOOD]},
        {"prompt": [{"role": "developer", "content": "Answer in digits."}, GOOD]},
        {"prompt": [GOOD, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": "4"}, GOOD]},
        {"prompt": [GOOD, {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "name": "calculator", "content": "4"}]},
        {"prompt": [{"role": "user", "content": [{"type": "text", "text": "What is in the picture?"},
                                                 {"type": "image", "url": "https://example.com/cat.png"}]}]},
        {"messages": [{"role": "user", "content": ""}]},
        {"prompt": "plain text stays a standard prompt"},
    ]
    assert check_columns(rows, source="dataset") is True
