"""Action parsing: names, aliases, indices, <answer> blocks, Box numbers, and the error messages."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from rl_plugin_gym.actions import BoxParser, DiscreteParser, last_int, parser_for
from rl_plugin_gym.policy import ActionParseError, InvalidActionError, InvalidActionPolicy
from rlcore.errors import ConfigError

LAKE = ("LEFT", "DOWN", "RIGHT", "UP")


def test_discrete_by_name_last_mention_wins_case_insensitive():
    p = DiscreteParser(4, names=LAKE)
    assert p("left") == 0
    assert p("I thought about UP, but I go Right.") == 2
    assert p("<answer>down</answer> then maybe up") == 1  # only the answer block counts


def test_discrete_names_beat_numbers_and_indices_work_alone():
    p = DiscreteParser(4, names=LAKE)
    assert p("after 3 steps: DOWN") == 1
    assert p("3") == 3
    with pytest.raises(ActionParseError, match="out of range"):
        p("7")
    with pytest.raises(ActionParseError, match="no action found; reply with one of LEFT, DOWN, RIGHT, UP"):
        p("hmm")


def test_multiword_names_and_aliases_do_not_match_inside_words():
    p = DiscreteParser(6, names=("SOUTH", "NORTH", "EAST", "WEST", "PICKUP", "DROPOFF"), aliases={"UP": "NORTH"})
    assert p("pick up the passenger") == 4
    assert p("Drop-off") == 5
    assert p("go up") == 1
    for inside_a_word in ("upward", "northeast?"):
        with pytest.raises(ActionParseError):
            p(inside_a_word)


def test_discrete_with_start_offset():
    p = DiscreteParser(3, start=-1)
    assert p("-1") == -1 and p("1") == 1
    with pytest.raises(ActionParseError):
        p("2")


def test_box_reads_the_last_numbers_and_clips():
    space = spaces.Box(low=-1.0, high=1.0, shape=(2,), dtype=np.float32)
    p = BoxParser(space)
    got = p("torque 0.5 and -3")
    assert got.dtype == np.float32 and got.tolist() == [0.5, -1.0]
    assert p("1 2 3 <answer>0.25 0.75</answer>").tolist() == [0.25, 0.75]
    with pytest.raises(ActionParseError, match="found 1 number"):
        p("0.3")


def test_parser_for_spaces():
    assert isinstance(parser_for(spaces.Discrete(2)), DiscreteParser)
    assert isinstance(parser_for(spaces.Box(0, 1, (1,))), BoxParser)
    assert parser_for(spaces.Dict({"a": spaces.Discrete(2)})) is None


def test_last_int():
    assert last_int("I guess 4, no, 6") == 6
    assert last_int("<answer>12</answer> 3") == 12
    assert last_int("none") is None
    assert last_int("My guess is 5.") == 5 and last_int("about 2.5") is None


def test_policy_retry_counts_and_ends_after_max():
    pol = InvalidActionPolicy("retry", penalty=-0.5, max_consecutive=2)
    obs, r, done, info = pol.handle("X", "zzz", ActionParseError("bad"))
    assert (r, done, info["invalid_actions"]) == (-0.5, False, 1) and "Try again" in obs
    pol.valid()
    assert not pol.handle("X", "zzz", ActionParseError("bad"))[2]
    obs, r, done, info = pol.handle("X", "zzz", ActionParseError("bad"))
    assert done and info["ended"] == "invalid_actions" and info["invalid_actions"] == 3


def test_policy_fail_raises_one_line_naming_env_and_reply():
    pol = InvalidActionPolicy("fail")
    with pytest.raises(InvalidActionError, match=r"invalid action 'zzz' in FrozenLake-v1: bad"):
        pol.handle("FrozenLake-v1", "zzz", ActionParseError("bad"))


def test_unknown_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="invalid_action='ignore'"):
        InvalidActionPolicy("ignore")
