"""Data types: turn invariants, trajectory flat views and JSON round trip, batch packing."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.types import Batch, Completion, SamplingParams, Trajectory, Turn


def _traj() -> Trajectory:
    t = Trajectory(prompt_ids=[1, 2, 3], messages=[{"role": "user", "content": "hi"}], data={"answer": "7"})
    t.turns.append(Turn.sampled(Completion(token_ids=[10, 11], logprobs=[-0.5, -1.5], finish_reason="stop", text="ab")))
    t.turns.append(Turn.observation([20, 21, 22], role="user", text="obs"))
    t.turns.append(Turn.sampled(Completion(token_ids=[12], logprobs=[-0.25], text="c")))
    t.num_turns = 2
    t.step_rewards = [0.5, 1.0]
    return t


def test_turn_lengths_must_agree():
    with pytest.raises(ValueError, match="same length"):
        Turn(token_ids=[1, 2], loss_mask=[1], logprobs=[None, None])


def test_flat_views_follow_turn_order():
    t = _traj()
    assert t.completion_ids == [10, 11, 20, 21, 22, 12]
    assert t.loss_mask == [1, 1, 0, 0, 0, 1]
    assert t.logprobs == [-0.5, -1.5, None, None, None, -0.25]
    assert t.input_ids == [1, 2, 3, 10, 11, 20, 21, 22, 12]
    assert t.logprobs_complete and t.total_reward == 1.5
    assert t.data_dict is t.data  # ms-swift name


def test_missing_logprobs_make_the_trajectory_incomplete():
    t = _traj()
    t.turns.append(Turn.sampled(Completion(token_ids=[5, 6], logprobs=None)))
    assert not t.logprobs_complete
    assert Completion(token_ids=[1], logprobs=[None]).logprobs_complete is False  # type: ignore[list-item]


def test_completion_looks_like_an_ms_swift_choice():
    c = Completion(token_ids=[1], logprobs=[-1.0], finish_reason="length", text="hello")
    assert c.message.content == "hello" and c.message.role == "assistant" and c.finish_reason == "length"


def test_json_round_trip_keeps_everything():
    t = _traj()
    t.rewards = {"acc": 1.0, "fmt": None}
    t.reward = 1.0
    t.infos = {"tensor": torch.tensor([1.0, 2.0]), "nested": {"s": {1}}}
    back = Trajectory.from_json(t.to_json())
    assert back.completion_ids == t.completion_ids and back.loss_mask == t.loss_mask
    assert back.logprobs == t.logprobs and back.rewards == t.rewards and back.reward == 1.0
    assert back.infos == {"tensor": [1.0, 2.0], "nested": {"s": [1]}}
    d = t.to_dict()
    assert len(d["completion_ids"]) == len(d["loss_mask"]) == len(d["logprobs"])


def test_batch_packs_right_padded_and_aligned():
    a, b = _traj(), Trajectory(prompt_ids=[4], turns=[Turn.sampled(Completion([7, 8], None))])
    batch = Batch.from_trajectories([a, b], advantages=[2.0, -1.0], pad_token_id=0)
    assert batch.input_ids.shape == (2, 9)
    assert batch.input_ids[1].tolist() == [4, 7, 8, 0, 0, 0, 0, 0, 0]
    assert batch.attention_mask[1].tolist() == [1, 1, 1, 0, 0, 0, 0, 0, 0]
    assert batch.completion_mask[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 1]
    assert batch.advantages[0, 3].item() == 2.0 and batch.advantages[1, 1].item() == -1.0
    assert math.isclose(batch.sampler_logps[0, 4].item(), -1.5)
    assert batch.is_valid.tolist() == [True, False]
    half = batch.select(slice(0, 1))
    assert half.size == 1 and half.input_ids.shape == (1, 9)


def test_per_token_advantages_pack_at_their_positions():
    t = _traj()
    batch = Batch.from_trajectories([t], advantages=[[1, 2, 0, 0, 0, 3]], pad_token_id=0)
    assert batch.advantages[0].tolist() == [0, 0, 0, 1, 2, 0, 0, 0, 3]


def test_sampling_params_replace():
    p = SamplingParams(max_tokens=8, temperature=0.7)
    q = p.replace(n=4)
    assert q.n == 4 and q.max_tokens == 8 and p.n == 1


def test_sampling_params_take_vllms_logprobs_argument():
    """The seed loops write SamplingParams(max_tokens=…, logprobs=1): accepted (the sampled token's
    logprob is always returned); asking for top-k alternatives is refused in one line."""
    import pytest

    from rlcore.errors import ConfigError

    assert SamplingParams(max_tokens=8, logprobs=1).logprobs == 1
    assert SamplingParams(logprobs=0).max_tokens == 256 and SamplingParams(logprobs=None).logprobs is None
    with pytest.raises(ConfigError, match=r"^SamplingParams\(logprobs=5\): .* pass logprobs=1") as info:
        SamplingParams(logprobs=5)
    assert "\n" not in str(info.value)
