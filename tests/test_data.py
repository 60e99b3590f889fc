"""Dataset loading: built-in rows, local files, column mapping, clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import rlcore
from rlcore.data import builtin_dataset, load_prompts, load_rows
from rlcore.rollout import render


@pytest.fixture(scope="module")
def tok(tiny_model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_builtin_dataset(tok: Any) -> None:
    rows = builtin_dataset()
    assert len(rows) >= 24 and {"question", "answer"} <= set(rows[0])
    a, op, b = rows[0]["question"].split("?")[0].split()[-3:]
    assert str(eval(f"{a}{op}{b}")) == rows[0]["answer"]  # answers are right
    prompts = load_prompts(None, tok, limit=3)
    assert len(prompts) == 3
    p = prompts[0]
    assert p.messages == [{"role": "user", "content": rows[0]["question"]}]
    assert p.prompt_ids == tok.encode(render(tok, p.messages, add_generation_prompt=True), add_special_tokens=False)
    assert tok.decode(p.prompt_ids).endswith("assistant\n") and p.data["answer"] == rows[0]["answer"]


def test_local_formats_and_columns(tok: Any, tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
             "solution": "x", "env_config": {"seed": 3}}]
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "m.json").write_text(json.dumps(rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"prompt": "hello", "answer": "1"}]), tmp_path / "p.parquet")
    for name in ("m.jsonl", "m.json"):
        p = load_prompts(str(tmp_path / name), tok)[0]
        assert p.messages[0]["role"] == "system" and p.data == {"solution": "x", "env_config": {"seed": 3}}
    p = load_prompts(str(tmp_path / "p.parquet"), tok, system_prompt="sys")[0]
    assert p.messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}] and p.data == {"answer": "1"}
    (tmp_path / "q.jsonl").write_text(json.dumps({"text_in": "what?", "answer": "2"}) + "\n")
    p = load_prompts(str(tmp_path / "q.jsonl"), tok, prompt_column="text_in")[0]
    assert p.messages == [{"role": "user", "content": "what?"}] and p.data["answer"] == "2"


def test_dataset_errors(tok: Any, tmp_path: Path) -> None:
    with pytest.raises(rlcore.DatasetError, match="does not exist"):
        load_rows(str(tmp_path / "missing.jsonl"))
    (tmp_path / "q.jsonl").write_text(json.dumps({"text_in": "what?"}) + "\n")
    with pytest.raises(rlcore.DatasetError, match=r"none of the columns .* \(it has: text_in\); name the prompt column"):
        load_prompts(str(tmp_path / "q.jsonl"), tok)
    with pytest.raises(rlcore.DatasetError, match="no column 'prompt_text'"):
        load_prompts(str(tmp_path / "q.jsonl"), tok, prompt_column="prompt_text")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(rlcore.DatasetError, match="line 1 is not valid JSON"):
        load_rows(str(tmp_path / "bad.jsonl"))
    with pytest.raises(rlcore.DatasetError, match="cannot load dataset 'no-such-org/no-such-set'"):
        load_rows("no-such-org/no-such-set")
    with pytest.raises(rlcore.DatasetError, match=r"'nope' is not a registered dataset source either \(sources: .*rlcore"):
        load_rows("nope:thing")  # SOURCE:SPEC with a misspelt source is tried as a hub name, then named as a source


def test_shared_gsm8k_reads(tok: Any, shared_data: Path) -> None:
    """The real GSM8K copy in the shared data folder (``<repo>/../shared/data`` or
    ``RLCORE_SHARED_DATA``): skipped when absent locally, a failure in CI."""
    path = shared_data / "gsm8k" / "test.jsonl"
    p = load_prompts(str(path), tok, limit=2)
    assert len(p) == 2 and "####" in p[0].data["answer"]


def test_one_rule_turns_a_row_into_a_prompt_for_every_command(tok: Any) -> None:
    """TRL's rule, in one function (rlcore.data.row_to_prompt): a plain-text ``prompt`` column is
    tokenized as is; a conversation is chat-templated. The trainer (make_prompt), the loop's
    make_prompts and its Rollout's dataset rows (as_prompts) and load_prompts agree on the ids."""
    from rlcore.data import row_to_prompt
    from rlcore.data.cursor import make_prompt
    from rlcore.loop import make_prompts
    from rlcore.loop.rollouts import as_prompts

    text = "What is 2 + 2?"
    templated = tok.encode(render(tok, [{"role": "user", "content": text}], add_generation_prompt=True),
                           add_special_tokens=False)
    cases = [({"prompt": text, "answer": "4"}, {}, tok(text=text)["input_ids"]),
             ({"prompt": [{"role": "user", "content": text}]}, {}, templated),
             ({"question": text}, {}, templated),
             ({"text_in": text}, {"prompt_column": "text_in"}, templated)]
    for row, kw, want in cases:
        got = [row_to_prompt(row, tok, **kw).prompt_ids, make_prompt(row, tok, True, kw.get("prompt_column")).prompt_ids,
               make_prompts([row], tok, **kw)[0].prompt_ids, load_prompts([row], tok, **kw)[0].prompt_ids]
        if not kw:
            got.append(as_prompts([row], tok)[0].prompt_ids)
        assert all(ids == list(want) for ids in got), (row, got)
    p = row_to_prompt({"prompt": text, "answer": "4"}, tok, system_prompt="be brief")  # a system prompt: a conversation
    assert p.messages[0] == {"role": "system", "content": "be brief"} and tok.decode(p.prompt_ids).startswith("<|im_start|>system")
    assert p.data == {"prompt": text, "answer": "4"}  # the prompt as written, for TRL-style rewards
