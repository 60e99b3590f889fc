"""A brand-new package that registers an env through the ``rlcore`` entry point, really pip-installed,
then played by gym_scheduler: third-party envs plug in exactly like this package's own."""

from __future__ import annotations

import sys

import pytest
from transformers import AutoTokenizer

import rlcore
from rlcore.rollout import run_rollouts
from rlcore.testing import ScriptedSampler
from rlcore.testing.packages import installed, write_plugin_package
from rlcore.types import Prompt, SamplingParams

DIST = "rlcore-test-parrot-env"
MODULE = "rlcore_test_parrot_env"

SOURCE = '''
import rlcore
from rlcore.envs import Env


class ParrotEnv(Env):
    """Rewards the model for repeating a word; sync methods on purpose (run in worker threads)."""

    def __init__(self, word="apple"):
        self.word = word
        self.closed = False

    def reset(self, request):
        return f"Say the word {self.word}.", {"word": self.word}, "You are a parrot."

    def step(self, action):
        hit = self.word in action.lower()
        return ("Well said." if hit else f"No, say {self.word}."), (1.0 if hit else 0.0), hit, {"hit": hit}

    def close(self):
        self.closed = True


@rlcore.hookimpl
def register_envs(register):
    register("parrot", ParrotEnv)
'''


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


async def test_pip_installed_env_runs_under_gym_scheduler(tmp_path, monkeypatch, tok):
    pkg = write_plugin_package(tmp_path, DIST, MODULE, SOURCE)
    try:
        with installed(pkg, DIST):
            monkeypatch.setenv("RLCORE_PLUGINS", f"rl-plugin-gym,{DIST}")
            rlcore.reload_plugins()
            assert "parrot" in rlcore.available("env")
            sampler = ScriptedSampler(["banana", "ok: APPLE"], tok)
            scheduler = rlcore.get("scheduler", "gym_scheduler")(sampler, env="parrot", max_turns=4)
            prompts = [Prompt(messages=[], prompt_ids=[], data={"env_config": {"word": "apple"}})]
            res = await run_rollouts(scheduler, prompts, sampling_params=SamplingParams(max_tokens=16), progress=False)
            (t,) = res.trajectories
            assert t.status == "ok" and t.step_rewards == [0.0, 1.0] and t.num_turns == 2
            assert t.messages[0] == {"role": "system", "content": "You are a parrot."}
            assert t.messages[3]["content"] == "No, say apple."
            record = next(r for r in rlcore.plugins().list() if r.dist == DIST)
            assert record.components == {"env": ["parrot"]} and record.error is None
    finally:
        sys.modules.pop(MODULE, None)
        monkeypatch.setenv("RLCORE_PLUGINS", "rl-plugin-gym")
        rlcore.reload_plugins()
    assert "parrot" not in rlcore.available("env")
