"""Issue 35 item 11: `rlcore check-rollouts` on a line whose token ids are not token ids (a string, a
float, a negative number, 10**30, one past the vocabulary) says so in one line naming the file, the
line number and the field. Was: an OverflowError / TypeError traceback from inside the tokenizer."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from rlcore.commands.cli import main


@pytest.fixture(scope="module")
def good_line(tiny_model_dir: str) -> dict[str, Any]:
    """One sound trajectory, as `rlcore rollout` writes it (scripted answer, real tokenizer)."""
    import asyncio

    from transformers import AutoTokenizer

    from rlcore.rollout import encode_prompt, run_rollouts
    from rlcore.rollout.scheduler import RolloutScheduler
    from rlcore.testing import ScriptedSampler
    from rlcore.types import Prompt, SamplingParams

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    msgs = [{"role": "user", "content": "what is 2 + 2?"}]
    res = asyncio.run(run_rollouts(RolloutScheduler(ScriptedSampler(["four"], tok)), [Prompt(msgs, encode_prompt(tok, msgs))],
                                   sampling_params=SamplingParams(max_tokens=16), progress=False))
    assert res.stats["ok"] == 1
    return json.loads(res.trajectories[0].to_json())


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        target: Any = d
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return mutate


def _flat(d: dict[str, Any]) -> None:  # a line with completion_ids only (no turns)
    d.pop("turns")
    d["completion_ids"][0] = -5


@pytest.mark.parametrize("mutate, field, shown", [
    (_set(("prompt_ids", 1), "x"), "prompt_ids[1]", '"x"'),
    (_set(("prompt_ids", 0), -1), "prompt_ids[0]", "-1"),
    (_set(("turns", 0, "token_ids", 0), 10**30), "turns[0].token_ids[0]", str(10**30)),
    (_set(("turns", 0, "token_ids", 1), 1.5), "turns[0].token_ids[1]", "1.5"),
    (_set(("turns", 0, "token_ids", 0), True), "turns[0].token_ids[0]", "true"),
    (_set(("turns", 0, "token_ids", 0), 99999), "turns[0].token_ids[0]", "99999"),
    (_flat, "completion_ids[0]", "-5"),
], ids=["string", "negative", "10**30", "float", "bool", "past the vocabulary", "flat completion_ids"])
def test_a_bad_token_id_is_one_line_naming_file_line_and_field(
        mutate: Callable[[dict[str, Any]], None], field: str, shown: str, good_line: dict[str, Any],
        tmp_path: Path, capsys: Any) -> None:
    bad = copy.deepcopy(good_line)
    mutate(bad)
    bad["uuid"] = "b" * 32
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(good_line) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(SystemExit) as exc:
        main(["check-rollouts", str(path)])
    assert exc.value.code == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert err.startswith(f"Error: {path}:2: {field} is {shown}, not a token id of this tokenizer (an integer from 0 to "), err


def test_sound_lines_still_pass(good_line: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(good_line) + "\n")
    main(["check-rollouts", str(path)])
    assert "1 sound, 0 with violations" in capsys.readouterr().err
