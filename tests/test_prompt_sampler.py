"""The ``prompt_sampler`` component kind (issue #31): ``uniform`` is the seeded order rlcore always
drew, prompt for prompt; ``difficulty`` passes over prompts whose last ``window`` groups all scored
one same reward, and its history survives a checkpoint so a resumed run draws what an
uninterrupted one would."""

from __future__ import annotations

import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import rlcore  # noqa: E402
from rlcore.testing.spread import by_row, easy_and_hard_rows  # noqa: E402
from rlcore.testing.cli_checks import fails_before_model_load  # noqa: E402
from rlcore.training.prompt_sampler import DifficultyPromptSampler  # noqa: E402
from rlcore.data.cursor import PromptCursor  # noqa: E402


def rows(n_easy: int = 3, n_hard: int = 3) -> list[dict[str, Any]]:
    return easy_and_hard_rows(n_easy, n_hard)


def _args(out: str, **over: Any) -> Any:
    base = dict(output_dir=out, num_generations=2, per_device_train_batch_size=4, max_completion_length=2, max_steps=4,
                learning_rate=1e-3, save_strategy="no", report_to="none", plots=False, disable_tqdm=True, seed=3)
    return rlcore.GRPOConfig(**{**base, **over})


def trainer(out: str, **over: Any) -> Any:
    from rlcore.data.demo import tiny_model_path

    t = rlcore.GRPOTrainer(tiny_model_path(), reward_funcs=[by_row], args=_args(out, **over), train_dataset=rows())
    t.drawn = []
    take = t._next_prompts

    def recording() -> Any:
        prompts = take()
        t.drawn.append([p.data["id"] for p in prompts])
        return prompts

    t._next_prompts = recording
    return t


def test_components_lists_the_kind(capsys: Any) -> None:
    from click.testing import CliRunner

    from rlcore.commands.cli import _load_commands, cli

    _load_commands()
    res = CliRunner().invoke(cli, ["components", "prompt_sampler"])
    assert res.exit_code == 0 and "prompt_sampler: difficulty, uniform" in res.output, res.output
    res = CliRunner().invoke(cli, ["components", "prompt_sampler", "difficulty"])
    assert "--window (int, default 2)" in res.output and "--mode" in res.output and "--min-weight" in res.output


def test_uniform_draws_the_seeded_order_of_before(tmp_path: Any) -> None:
    t = trainer(str(tmp_path / "u"), prompt_sampler="uniform")
    t.train()
    cursor = PromptCursor(6, seed=3)  # the walk the trainer took before prompt samplers existed
    ids = [r["id"] for r in rows()]
    assert t.drawn == [[ids[i] for i in cursor.take(2)] for _ in range(4)]
    assert not any(k.startswith("prompt_sampler/") for h in t.state.log_history for k in h)


def test_difficulty_skips_prompts_every_completion_solved(tmp_path: Any) -> None:
    t = trainer(str(tmp_path / "d"), prompt_sampler="difficulty", prompt_sampler_options={"window": 1}, max_steps=6)
    t.train()
    seen_easy: set[str] = set()
    for batch in t.drawn:
        for pid in batch:
            if pid.startswith("e"):
                assert pid not in seen_easy, t.drawn  # once scored all-1.0 it is never drawn again
                seen_easy.add(pid)
    later = [pid for batch in t.drawn[3:] for pid in batch]
    assert later and all(pid.startswith("h") for pid in later), t.drawn
    logged = [h for h in t.state.log_history if "prompt_sampler/skipped" in h]
    assert logged and sum(h["prompt_sampler/skipped"] for h in logged) > 0


def test_downweight_keeps_settled_prompts_with_min_weight() -> None:
    def draws(min_weight: float) -> list[int]:
        s = DifficultyPromptSampler(PromptCursor(4, seed=0), window=2, mode="downweight", min_weight=min_weight)
        s.observe([(0, [1.0, 1.0]), (0, [1.0, 1.0]), (1, [0.0, 1.0]), (1, [0.0, 0.0])])
        return s.take(400)

    assert 0 not in draws(0.0) and 1 in draws(0.0)  # prompt 1 had spread in one of its last two groups
    kept = draws(0.25).count(0)
    assert 0 < kept < draws(1.0).count(0) == 100
    assert kept == draws(0.25).count(0)  # seeded: the same draws every time


def test_every_prompt_settled_still_draws() -> None:
    s = DifficultyPromptSampler(PromptCursor(2, seed=0), window=1)
    s.observe([(0, [0.0, 0.0]), (1, [1.0, 1.0])])
    assert len(s.take(3)) == 3
    assert s.metrics()["prompt_sampler/exhausted"] >= 1


def test_resumed_run_draws_what_the_uninterrupted_one_drew(tmp_path: Any) -> None:
    from rlcore.testing.runs import stop_at_step

    over = dict(prompt_sampler="difficulty", prompt_sampler_options={"window": 1}, max_steps=6, save_strategy="steps",
                save_steps=3)
    whole = trainer(str(tmp_path / "whole"), **over)
    whole.train()

    first = trainer(str(tmp_path / "cut"), **over)
    first.add_callback(stop_at_step(3))
    first.train()
    assert os.path.isdir(tmp_path / "cut" / "checkpoint-3") and first.state.global_step == 3
    second = trainer(str(tmp_path / "cut"), **over)
    second.train(resume_from_checkpoint=True)
    assert first.drawn + second.drawn == whole.drawn
    assert any(pid.startswith("e") for pid in whole.drawn[0] + whole.drawn[1]) and \
        all(pid.startswith("h") for b in whole.drawn[3:] for pid in b)


@pytest.mark.parametrize("argv, line", [
    (["--prompt-sampler", "difficulti"], "Error: no prompt_sampler named 'difficulti'; available: difficulty, uniform"),
    (["--prompt-sampler", "difficulty", "--prompt_sampler_options", '{"windw": 2}'],
     "prompt_sampler_options has windw, which prompt_sampler 'difficulty' does not declare; it accepts: min_weight, mode, window"),
])
def test_bad_prompt_sampler_is_one_line_before_the_model_loads(argv: list[str], line: str, tmp_path: Any, capsys: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    err = fails_before_model_load([*argv, "--output-dir", str(tmp_path / "o")], capsys, monkeypatch)
    assert line in err


def test_difficulty_options_are_flags(tmp_path: Any) -> None:
    from rlcore.commands.train import build_plan

    plan = build_plan(["--prompt-sampler", "difficulty", "--window", "3", "--mode", "downweight",
                       "--output_dir", str(tmp_path / "t")])
    assert plan.component_options["prompt_sampler"] == {"window": 3, "mode": "downweight"}
    with pytest.raises(rlcore.ConfigError, match="window=0 must be an int >= 1"):
        DifficultyPromptSampler(PromptCursor(2), window=0)


def test_a_plugin_registers_its_own_prompt_sampler(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlcore.testing.packages import load_in_process
    from rlcore.training.prompt_sampler import UniformPromptSampler

    class LastRowFirst(UniformPromptSampler):
        def __init__(self, cursor: Any, start: int = 5) -> None:
            super().__init__(cursor)
            self.next = start

        def take(self, k: int) -> list[int]:
            out = [(self.next - j) % self.cursor.n for j in range(k)]
            self.next -= k
            return out

    def register_prompt_samplers(register: Any) -> None:
        register("last_first_t", LastRowFirst)

    load_in_process(monkeypatch, "last_first_plugin_t", register_prompt_samplers=register_prompt_samplers)
    t = trainer(str(tmp_path / "p"), prompt_sampler="last_first_t", prompt_sampler_options={"start": 4}, max_steps=2)
    t.train()
    assert t.drawn == [["h1", "h0"], ["e2", "e1"]]


def test_two_ranks_draw_what_one_process_draws(tmp_path: Any) -> None:
    """Data parallel: each rank scores only its share of the groups, yet every rank's sampler learns
    every group (gathered), so the ranks keep one order — the one a single process draws."""
    import json
    from pathlib import Path

    from rlcore.testing.runs import launch_ranks

    script = Path(__file__).with_name("dp_prompt_sampler_run.py")
    got = {}
    for ranks in (1, 2):
        out = tmp_path / f"r{ranks}"
        out.mkdir()
        launch_ranks(script, ranks, out, 4 // ranks)
        got[ranks] = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)]
    one, (r0, r1) = got[1][0], got[2]
    assert r0["world_size"] == 2 and r0["drawn"] == r1["drawn"] == one["drawn"]
    assert r0["state"] == r1["state"] == one["state"]
    easy = [i for batch in one["drawn"] for i in batch if i < 4]
    assert one["state"]["history"] and easy and len(easy) == len(set(easy)), one["drawn"]  # solved once: never again
