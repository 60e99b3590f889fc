"""Per-turn samples with conversations of their own (``infos["sample_messages"]``): an episode
whose later sample renders a rewritten history (an agent that compacted or edited its messages)
is split into samples each checked against the conversation it was sampled in."""

from __future__ import annotations

from typing import Any

from rlcore import chat_template as tk
from rlcore.rollout.invariants import check_trajectory
from rlcore.types import Trajectory, Turn


def _sampled(tok: Any, text: str) -> Turn:
    ids = tk.encode_text(tok, text) + [tok.convert_tokens_to_ids("<|im_end|>")]
    return Turn(ids, [1] * len(ids), [-0.5] * len(ids), text=text, finish_reason="stop")


def _episode(tok: Any, pinned: bool) -> Trajectory:
    first = [{"role": "user", "content": "What is 2 + 3?"}]
    reply1 = {"role": "assistant", "content": "5"}
    # the rewritten history: the first exchange compacted into one user message
    second = [{"role": "user", "content": "Earlier you said 5. Now add 4 to it."}]
    reply2 = {"role": "assistant", "content": "9"}
    restart_text = tk.render(tok, second, add_generation_prompt=True)
    traj = Trajectory(prompt_ids=tk.encode_prompt(tok, first), messages=second + [reply2])
    traj.turns = [_sampled(tok, "5"), Turn.restart(tk.encode_text(tok, restart_text), messages=1, text=restart_text),
                  _sampled(tok, "9")]
    traj.status = "ok"
    traj.infos["prompt_messages"] = 1
    if pinned:
        traj.infos["sample_messages"] = [first + [reply1]]
    return traj


def test_each_sample_is_checked_against_its_own_conversation(tiny_tokenizer: Any) -> None:
    traj = _episode(tiny_tokenizer, pinned=True)
    samples = traj.turn_samples()
    assert [s.messages for s in samples] == [traj.infos["sample_messages"][0], traj.messages]
    assert all("sample_messages" not in s.infos for s in samples)
    assert check_trajectory(traj, tiny_tokenizer) == []


def test_a_sample_is_held_to_the_conversation_it_names(tiny_tokenizer: Any) -> None:
    traj = _episode(tiny_tokenizer, pinned=True)
    traj.infos["sample_messages"] = [[{"role": "user", "content": "What is 7 + 1?"}, {"role": "assistant", "content": "5"}]]
    violations = check_trajectory(traj, tiny_tokenizer)
    assert [v.check for v in violations] == ["prompt"]


def test_without_one_the_first_sample_reads_the_final_conversation(tiny_tokenizer: Any) -> None:
    # as before sample_messages: the final messages, cut before the next sample's prompt
    samples = _episode(tiny_tokenizer, pinned=False).turn_samples()
    assert samples[0].messages == [] and samples[1].messages[-1] == {"role": "assistant", "content": "9"}


def test_a_json_round_trip_keeps_the_conversations(tiny_tokenizer: Any) -> None:
    traj = Trajectory.from_json(_episode(tiny_tokenizer, pinned=True).to_json())
    assert check_trajectory(traj, tiny_tokenizer) == []
