"""guess_number's dense (``shaped``) reward and reply formats, on the environment class the server runs."""

from __future__ import annotations

import pytest

from rl_plugin_openenv.games import GuessAction, GuessNumberEnvironment


@pytest.fixture
def env():
    """One environment, closed after the test (the class counts live ones: servers' leak checks read it)."""
    e = GuessNumberEnvironment()
    yield e
    e.close()


def _play(env, *guesses):
    return [env.step(GuessAction(message=str(g))) for g in guesses]


def test_shaped_reward_pays_valid_guesses_and_only_new_closeness(env):
    env.reset(low=1, high=64, max_attempts=8, target=40, shaped=True)
    obs = _play(env, 10, 30, 30, 1, 99)
    junk = env.step(GuessAction(message="no idea"))
    win = env.step(GuessAction(guess=40))
    width = 63
    assert obs[0].reward == pytest.approx(0.05 + 0.05 * (1 - 30 / width))  # valid, and the closest so far
    assert obs[1].reward == pytest.approx(0.05 + 0.05 * (1 - 10 / width))  # closer still
    assert obs[2].reward == pytest.approx(0.05)  # repeating a guess: valid, but no new closeness
    assert obs[3].reward == pytest.approx(0.05)  # farther away: valid only
    assert obs[4].reward == 0.0 and "outside" in obs[4].text  # not a valid guess
    assert junk.reward == 0.0 and "could not find" in junk.text
    assert win.reward == 1.0 and win.done
    assert sum(o.reward for o in obs) + junk.reward < win.reward  # shaping stays below one win


def test_unshaped_reward_is_sparse(env):
    env.reset(low=1, high=8, target=5)
    assert [o.reward for o in _play(env, 1, 4, 5)] == [0.0, 0.0, 1.0]


def test_reply_formats(env):
    assert '{"guess": 32}' in env.reset(low=1, high=64).text
    assert "just your guess, a whole number like 32" in env.reset(low=1, high=64, reply="number").text
    with pytest.raises(ValueError, match="reply must be one of"):
        env.reset(reply="yaml")
