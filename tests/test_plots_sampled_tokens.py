"""The completion-length plot counts what the model sampled (issue 34, point 7): a multi-turn run's
plot showed 210-270 "completion tokens" beside a header saying "6 tokens max per turn", because
`completion_length` counts the environment's observations too."""

from __future__ import annotations

import json
from typing import Any

from rlcore.training.plots import length_series, write_plots


def _rows(multi_turn: bool) -> list[dict[str, Any]]:
    rows = []
    for step in range(1, 5):
        if multi_turn:  # 6 turns of up to 6 sampled tokens, plus ~40 observation tokens per turn
            rows.append({"step": step, "reward": 0.2, "reward_std": 0.1, "num_turns": 6.0, "completion_length": 240.0,
                         "completion_length/max": 270.0, "completions/mean_length": 30.0,
                         "completions/max_length": 36.0})
        else:
            rows.append({"step": step, "reward": 0.2, "reward_std": 0.1, "num_turns": 1.0, "completion_length": 8.0,
                         "completion_length/max": 8.0, "completions/mean_length": 8.0, "completions/max_length": 8.0})
    return rows


def test_a_multi_turn_run_plots_sampled_tokens_per_episode_and_per_turn(tmp_path: Any) -> None:
    title, ylabel, series = length_series(_rows(multi_turn=True), max_completion_length=6)
    by_label = {label: ys for label, _, ys, _ in series}
    assert "observations not counted" in title and ylabel == "sampled tokens"
    assert by_label["per episode: mean"] == [30.0] * 4 and by_label["per episode: max"] == [36.0] * 4
    assert by_label["per turn: mean"] == [5.0] * 4
    assert by_label["per-turn cap (max_completion_length=6)"] == [6.0, 6.0]
    assert not any(240.0 in ys or 270.0 in ys for ys in by_label.values())  # the observations are not in it
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(multi_turn=True)))
    paths = write_plots(str(tmp_path), max_completion_length=6)
    assert (tmp_path / "plots" / "completion_length.png").stat().st_size > 1000 and len(paths) == 2


def test_a_single_turn_run_plots_tokens_per_completion() -> None:
    title, ylabel, series = length_series(_rows(multi_turn=False), max_completion_length=8)
    assert [label for label, *_ in series] == ["mean", "max"] and ylabel == "sampled tokens per completion"
    # an older metrics file without TRL's keys still plots
    old = [{k: v for k, v in r.items() if not k.startswith("completions/")} for r in _rows(multi_turn=False)]
    assert length_series(old)[2][0][2] == [8.0] * 4
