"""Advantage estimators against plain-python references, incl. NaN rewards, flat and uneven groups."""

from __future__ import annotations

import math
import random
import statistics

import attrs
import pytest
import torch

import rlcore
from rlcore.types import Trajectory, Turn


def _std(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else float("nan")


def _groups(sizes: list[int]) -> list[str]:
    return [f"g{k}" for k, n in enumerate(sizes) for _ in range(n)]


def _rewards(seed: int, n: int) -> list[float | None]:
    rng = random.Random(seed)
    out: list[float | None] = [rng.gauss(0, 1) for _ in range(n)]
    out[1] = None  # unscorable
    return out


def ref_grpo(rewards: list[float | None], groups: list[str], scale: str) -> list[float]:
    valid_all = [r for r in rewards if r is not None]
    bstd = _std(valid_all)
    out = [0.0] * len(rewards)
    for g in dict.fromkeys(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        vals = [rewards[i] for i in idx if rewards[i] is not None]
        if len(vals) < 2 or max(vals) - min(vals) < 1e-12:
            continue
        mean = sum(vals) / len(vals)
        for i in idx:
            if rewards[i] is None:
                continue
            a = rewards[i] - mean
            if scale == "group":
                a /= _std(vals) + 1e-4
            elif scale == "batch":
                a /= bstd + 1e-4
            out[i] = a
    return out


def _call(name: str, rewards, groups, trajectories=None, **cfg):
    est = rlcore.get("advantage", name)(config=type("C", (), cfg)())
    r = torch.tensor([math.nan if x is None else x for x in rewards])
    adv = est.compute_advantage(rewards=r, groups=groups, trajectories=trajectories or [], config=est.config)
    return adv, est.stats


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_matches_reference(scale: str) -> None:
    sizes = [4, 4, 3, 5]  # uneven: a scheduler returned one trajectory per round for some requests
    groups = _groups(sizes)
    rewards = _rewards(0, len(groups))
    rewards[8:11] = [0.5, 0.5, 0.5]  # a flat group
    adv, stats = _call("grpo", rewards, groups, scale_rewards=scale)
    want = ref_grpo(rewards, groups, scale)
    assert adv.shape == (len(groups),)
    for a, w in zip(adv.tolist(), want):
        assert abs(a - w) < 1e-6
    assert adv[1] == 0.0  # NaN reward: no advantage
    assert stats.groups == 4 and stats.zero_std_groups == 1 and stats.zero_std_frac == 0.25
    assert torch.all(adv[8:11] == 0)


def test_rloo_matches_reference() -> None:
    groups = _groups([4, 3, 2])
    rewards = _rewards(1, len(groups))
    adv, stats = _call("rloo", rewards, groups)
    for i, g in enumerate(groups):
        if rewards[i] is None:
            assert adv[i] == 0
            continue
        others = [rewards[j] for j, h in enumerate(groups) if h == g and j != i and rewards[j] is not None]
        assert abs(float(adv[i]) - (rewards[i] - sum(others) / len(others))) < 1e-6
    assert stats.zero_std_groups == 0


def test_reinforce_plus_plus_matches_reference() -> None:
    groups = _groups([3, 3, 3])
    rewards = _rewards(2, len(groups))
    rewards[3:6] = [1.0, 1.0, 1.0]
    adv, stats = _call("reinforce_plus_plus", rewards, groups)
    centred: list[float | None] = []
    for i, g in enumerate(groups):
        if rewards[i] is None:
            centred.append(None)
            continue
        vals = [rewards[j] for j, h in enumerate(groups) if h == g and rewards[j] is not None]
        centred.append(rewards[i] - sum(vals) / len(vals))
    sd = _std([c for c in centred if c is not None])
    for a, c in zip(adv.tolist(), centred):
        assert abs(a - (0.0 if c is None else c / (sd + 1e-4))) < 1e-6
    assert stats.zero_std_groups == 1
    assert torch.all(adv[3:6] == 0)


def test_all_nan_and_singleton_groups_are_zero() -> None:
    for name in ("grpo", "rloo", "reinforce_plus_plus"):
        adv, stats = _call(name, [None, None, 3.0], ["a", "a", "b"])
        assert adv.tolist() == [0.0, 0.0, 0.0]
        assert stats.zero_std_groups == 2


def _traj(group: str, obs: list[list[int]], step_rewards: list[float]) -> Trajectory:
    """A multi-turn trajectory: assistant turn k acts on observation obs[k] (obs[0] is the prompt)."""
    t = Trajectory(prompt_ids=obs[0], group_id=group)
    for k in range(len(step_rewards)):
        if k > 0:
            t.turns.append(Turn.observation(obs[k]))
        t.turns.append(Turn(token_ids=[50 + k, 60 + k], loss_mask=[1, 1], logprobs=[-0.1, -0.2]))
    t.step_rewards = list(step_rewards)
    return t


def test_gigpo_step_level() -> None:
    gamma, w = 0.5, 1.0
    trajs = [
        _traj("g", [[1], [7], [8]], [0.0, 0.0, 1.0]),
        _traj("g", [[1], [7], [9]], [0.0, 1.0, 0.0]),
        _traj("g", [[1], [8]], [0.0, 0.0]),
    ]
    rewards = [t.total_reward for t in trajs]
    adv, stats = _call("gigpo", rewards, ["g"] * 3, trajs, gigpo_gamma=gamma, gigpo_step_weight=w, scale_rewards="group")
    episode = ref_grpo(rewards, ["g"] * 3, "group")
    # returns per assistant turn
    R = [[0 + gamma * (0 + gamma * 1), 0 + gamma * 1, 1.0], [gamma * 1, 1.0, 0.0], [0.0, 0.0]]
    # anchors: prompt [1] -> turn0 of all three; obs [7] -> turn1 of traj 0,1; obs [8] -> traj0 turn2, traj2 turn1
    def norm(vals: list[float]) -> list[float]:
        m = sum(vals) / len(vals)
        return [(v - m) / (_std(vals) + 1e-4) for v in vals]

    s_prompt = norm([R[0][0], R[1][0], R[2][0]])
    s_7 = norm([R[0][1], R[1][1]])
    s_8 = norm([R[0][2], R[2][1]])
    want_turns = [
        [episode[0] + s_prompt[0], episode[0] + s_7[0], episode[0] + s_8[0]],
        [episode[1] + s_prompt[1], episode[1] + s_7[1], episode[1] + 0.0],  # obs [9] alone: no step signal
        [episode[2] + s_prompt[2], episode[2] + s_8[1]],
    ]
    for t, a, want in zip(trajs, adv, want_turns):
        assert len(a) == t.num_completion_tokens
        k = -1
        pos = 0
        for turn in t.turns:
            if any(turn.loss_mask):
                k += 1
                for v in a[pos : pos + len(turn.token_ids)]:
                    assert abs(v - want[k]) < 1e-6
            pos += len(turn.token_ids)
    assert stats.groups == 1


def test_advantage_config_is_what_the_estimators_read() -> None:
    """AdvantageConfig carries what the built-ins read from a GRPOConfig, with their defaults; an
    estimator given it, the GRPOConfig, or nothing (the hook's config then) computes the same."""
    from rlcore.algorithms.advantages import AdvantageConfig
    from rlcore.training.config import GRPOConfig

    args = GRPOConfig(output_dir="/tmp/x", scale_rewards="batch", multi_objective_aggregation="normalize_then_sum")
    cfg = AdvantageConfig.from_config(args)
    assert (cfg.scale_rewards, cfg.multi_objective_aggregation) == ("batch", "normalize_then_sum")
    assert AdvantageConfig.of(cfg) is cfg and AdvantageConfig.of(None) == AdvantageConfig()
    assert AdvantageConfig() == AdvantageConfig.from_config(object())  # a config without the fields: the defaults
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.scale_rewards = "none"  # type: ignore[misc]
    groups = _groups([4, 4])
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.5, 3.0, 3.0, 1.0, 0.0])
    plain = GRPOConfig(output_dir="/tmp/x", scale_rewards="batch")
    for config in (plain, AdvantageConfig.from_config(plain)):
        est = rlcore.get("advantage", "grpo")(config=config)
        got = est.compute_advantage(rewards=rewards, groups=groups, trajectories=[], config=config)
        assert torch.allclose(got, torch.tensor(ref_grpo(rewards.tolist(), groups, "batch"), dtype=torch.float32), atol=1e-6)
    # no config of its own: the hook's (the GRPOConfig the trainer passes), GDPO's batch whitening included
    est = rlcore.get("advantage", "grpo")(config=None)
    got = est.compute_advantage(rewards=rewards, groups=groups, trajectories=[], config=args)
    want = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    assert torch.allclose(got, want, atol=1e-6)
    gigpo = rlcore.get("advantage", "gigpo")(config=AdvantageConfig(gigpo_gamma=0.5))
    assert (gigpo.gamma, gigpo.step_weight) == (0.5, 1.0)
