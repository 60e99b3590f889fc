"""Every component kind has the same shape: a Protocol (rlcore.protocols), options it declares
itself, ``<kind>_options`` in GRPOConfig, and command-line flags routed to whichever chosen
component declares them. Exercised with a really pip-installed third-party package that registers
an env, a loss with its own knob and an advantage estimator with its own option."""

from __future__ import annotations

import sys
import warnings

import pytest
from transformers import AutoTokenizer

import rlcore
from rlcore.errors import ConfigError
from rlcore.rollout import EnvScheduler, run_rollouts
from rlcore.testing import ScriptedSampler
from rlcore.testing.packages import installed, write_plugin_package
from rlcore.types import Prompt, SamplingParams

DIST = "rlcore-test-contracts"
MODULE = "rlcore_test_contracts"

SOURCE = '''
import rlcore
from rlcore.algorithms.advantages import GRPOAdvantage
from rlcore.algorithms.losses import grpo_loss
from rlcore.envs import Env


class ParrotEnv(Env):
    """Rewards the model for saying ``word``; sync methods on purpose (run in worker threads)."""

    def __init__(self, word="apple", bonus=1.0):
        self.word, self.bonus = word, float(bonus)

    def reset(self, request):
        return f"Say the word {self.word}.", {}, "You are a parrot."

    def step(self, action):
        hit = self.word in action.lower()
        return ("Well said." if hit else f"No, say {self.word}."), (self.bonus if hit else 0.0), hit, {}


def scaled_loss(logps, old_logps, advantages, mask, *, ref_logps=None, sampler_logps=None, is_valid=None, config):
    loss, metrics = grpo_loss(logps, old_logps, advantages, mask, ref_logps=ref_logps,
                              sampler_logps=sampler_logps, is_valid=is_valid, config=config)
    return loss * config.scale, {**metrics, "scale": float(config.scale)}


scaled_loss.options = {"scale": 1.0}


class ShiftedAdvantage(GRPOAdvantage):
    def __init__(self, config=None, *, shift: float = 0.0, **options):
        super().__init__(config, **options)
        self.shift = float(shift)

    @rlcore.hookimpl
    def compute_advantage(self, rewards, groups, trajectories, config):
        return super().compute_advantage(rewards, groups, trajectories, config) + self.shift


class MySampler(rlcore.Sampler):
    shares_trainer_module = True

    def __init__(self, model=None, tokenizer=None, seed=None):
        self.model, self.tokenizer, self.seed = model, tokenizer, seed


class LengthTimes(rlcore.Reward):
    def __init__(self, factor: float = 1.0):
        self.factor = float(factor)

    def score(self, completion_ids, **_):
        return [self.factor * len(ids) for ids in completion_ids]


@rlcore.hookimpl
def register_envs(register):
    register("parrot", ParrotEnv)


@rlcore.hookimpl
def register_rewards(register):
    register("length_times", LengthTimes)


@rlcore.hookimpl
def register_losses(register):
    register("scaled", scaled_loss)


@rlcore.hookimpl
def register_advantages(register):
    register("shifted", ShiftedAdvantage)


@rlcore.hookimpl
def register_samplers(register):
    register("module_sampler", MySampler)
'''


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    pkg = write_plugin_package(tmp_path_factory.mktemp("pkg"), DIST, MODULE, SOURCE)
    with installed(pkg, DIST):
        try:
            yield DIST
        finally:
            sys.modules.pop(MODULE, None)


@pytest.fixture
def rlcore_plugins(package) -> str:
    """Only the test package: no plugin package of this repository, so only the core's env scheduler."""
    return package


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _parrot_prompts(n=1, **env_config):
    return [Prompt(messages=[], prompt_ids=[], data={"env_config": dict(env_config)}) for _ in range(n)]


async def test_a_third_party_env_plays_under_the_core_env_scheduler(package, tok) -> None:
    assert "gym_scheduler" not in rlcore.available("scheduler")  # rl-plugin-gym is not loaded
    sampler = ScriptedSampler(["banana", "ok: PEAR"], tok)
    sched = rlcore.get("scheduler", "env_scheduler")(sampler, env="parrot", env_kwargs='{"word": "pear"}', max_turns=4)
    res = await run_rollouts(sched, _parrot_prompts(), sampling_params=SamplingParams(max_tokens=16), progress=False)
    (t,) = res.trajectories
    assert t.status == "ok" and t.step_rewards == [0.0, 1.0] and t.num_turns == 2
    assert t.messages[0] == {"role": "system", "content": "You are a parrot."}
    assert t.messages[1]["content"] == "Say the word pear."


async def test_any_env_scheduler_subclass_resolves_registered_envs(package, tok) -> None:
    class Shouting(EnvScheduler):  # a third party's env scheduler: only its formatting differs
        name = "shouting"

        def format_observation(self, observation):
            return str(observation).upper()

    sampler = ScriptedSampler(["apple"], tok)
    sched = Shouting(sampler, tokenizer=tok, env="parrot", max_turns=2)
    rows = _parrot_prompts(2, bonus=2.5)  # a row's env_config overrides env_kwargs and defaults
    res = await run_rollouts(sched, rows, sampling_params=SamplingParams(max_tokens=16), progress=False)
    assert [t.step_rewards for t in res.trajectories] == [[2.5], [2.5]]
    assert res.trajectories[0].messages[1]["content"] == "SAY THE WORD APPLE."


def test_unknown_env_or_env_option_is_one_line(package, tok) -> None:
    make = rlcore.get("scheduler", "env_scheduler")
    with pytest.raises(rlcore.UnknownComponentError, match="no env named 'parot'.*parrot"):
        make(ScriptedSampler(["x"], tok), env="parot")
    with pytest.raises(ConfigError, match="env 'parrot' does not take option.*colour.*takes: bonus"):
        make(ScriptedSampler(["x"], tok), env="parrot", env_kwargs={"colour": "red"})  # before any rollout
    sched = make(ScriptedSampler(["x"], tok))  # no run-level env: a row names it, and its options are checked then
    with pytest.raises(ConfigError, match="env 'parrot' does not take option.*colour"):
        sched.make_env(_parrot_prompts(name="parrot", colour="red")[0])


def test_train_flags_reach_the_component_that_declares_them(package, tmp_path) -> None:
    from rlcore.algorithms.losses import LossConfig
    from rlcore.commands.train import apply_component_options, build_plan
    from rlcore.training.components import make_advantage

    plan = build_plan([
        "--scheduler", "env_scheduler", "--env", "parrot", "--word", "kiwi", "--reward", "env_reward",
        "--loss_type", "scaled", "--scale", "0.5", "--advantage", "shifted", "--shift", "0.25",
        "--dataset", str(_dataset(tmp_path)), "--output_dir", str(tmp_path / "out"),
    ])
    opts = plan.component_options
    assert opts["env"] == {"word": "kiwi"} and opts["loss"] == {"scale": 0.5} and opts["advantage"] == {"shift": 0.25}
    assert opts["scheduler"] == {"env": "parrot"}
    apply_component_options(plan.args, opts)
    assert plan.args.scheduler_options["env_kwargs"] == {"word": "kiwi"}
    assert LossConfig.from_args(plan.args, num_items=3).scale == 0.5
    assert make_advantage(plan.args).shift == 0.25
    with pytest.raises(ConfigError, match="unknown option --sharpness.*loss 'scaled' accepts --scale"):
        build_plan(["--loss_type", "scaled", "--sharpness", "2", "--output_dir", str(tmp_path / "o2")])


def test_reward_class_options_are_flags_in_both_commands(package, tmp_path) -> None:
    import json

    from click.testing import CliRunner

    from rlcore.commands.cli import _load_commands, cli
    from rlcore.commands.train import build_plan

    plan = build_plan(["--reward", "length_times", "--factor", "2", "--output_dir", str(tmp_path / "t")])
    assert plan.component_options["reward"] == {"length_times": {"factor": 2.0}}
    _load_commands()
    out = tmp_path / "r.jsonl"
    res = CliRunner().invoke(cli, ["rollout", "--limit", "2", "--max-completion-length", "4", "--no-progress",
                                   "--reward", "length_times", "--factor", "0.5", "--output", str(out)])
    assert res.exit_code == 0, res.output
    for line in out.read_text().splitlines():
        t = json.loads(line)
        assert t["rewards"]["length_times"] == 0.5 * len(t["completion_ids"])


def test_config_options_are_checked_against_what_the_component_declares(package, tmp_path) -> None:
    from rlcore.training.config import validate_components

    args = rlcore.GRPOConfig(output_dir=str(tmp_path), loss_type="scaled", loss_options={"scael": 2.0},
                             reward_funcs=["env_reward"], report_to=[])
    with pytest.raises(ConfigError, match="loss_options has scael, which loss 'scaled' does not declare; it accepts: scale"):
        validate_components(args)
    args = rlcore.GRPOConfig(output_dir=str(tmp_path), advantage="shifted", advantage_options='{"shfit": 1}',
                             reward_funcs=["env_reward"], report_to=[])
    with pytest.raises(ConfigError, match="advantage_options has shfit.*accepts: shift"):
        validate_components(args)


def test_a_sampler_says_it_shares_the_trainers_module(package, tok, tmp_path) -> None:
    import torch

    from rlcore.training.components import make_sampler

    module = torch.nn.Linear(2, 2)
    args = rlcore.GRPOConfig(output_dir=str(tmp_path), sampler="module_sampler", seed=5, report_to=[])
    sampler = make_sampler(args, module, tok)
    assert sampler.model is module and sampler.seed == 5


def _dataset(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"env_config": {"name": "parrot"}}\n' * 4)
    return path


# --- the built-ins (no package needed) -----------------------------------------------------------
def test_loss_knobs_are_declared_by_the_loss_and_trl_fields_still_reach_them(tmp_path) -> None:
    from rlcore.algorithms.losses import LossConfig
    from rlcore.protocols import declared_options

    assert declared_options(rlcore.get("loss", "sapo")) == {"sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05}
    assert declared_options(rlcore.get("loss", "grpo")) == {}
    args = rlcore.GRPOConfig(output_dir=str(tmp_path), loss_type="sapo", sapo_temperature_pos=1.3, report_to=[])
    cfg = LossConfig.from_args(args, num_items=4)
    assert cfg.sapo_temperature_pos == 1.3 and cfg.sapo_temperature_neg == 1.05 and cfg.num_items == 4
    assert cfg.options == {"sapo_temperature_pos": 1.3, "sapo_temperature_neg": 1.05}  # no vespo knob for sapo
    args = rlcore.GRPOConfig(output_dir=str(tmp_path), loss_type="sapo", sapo_temperature_pos=1.3,
                             loss_options={"sapo_temperature_pos": 2.0}, report_to=[])
    assert LossConfig.from_args(args).sapo_temperature_pos == 2.0  # loss_options beats the TRL field
    bare = LossConfig(epsilon=0.1, vespo_k_pos=1.5)
    assert bare.epsilon == 0.1 and bare.vespo_k_pos == 1.5 and bare.vespo_k_neg == 3.0
    with pytest.raises(AttributeError, match="no knob 'nope'"):
        bare.nope


def test_gigpo_options_are_the_estimators_and_the_old_fields_still_work(tmp_path) -> None:
    from rlcore.training.components import make_advantage

    args = rlcore.GRPOConfig(output_dir=str(tmp_path), advantage="gigpo", advantage_options={"gamma": 0.5}, report_to=[])
    est = make_advantage(args)
    assert (est.gamma, est.step_weight) == (0.5, 1.0)
    with pytest.warns(FutureWarning, match="gigpo_gamma is deprecated: use advantage_options"):
        old = rlcore.GRPOConfig(output_dir=str(tmp_path), advantage="gigpo", gigpo_gamma=0.7, report_to=[])
    assert old.advantage_options == {"gamma": 0.7} and make_advantage(old).gamma == 0.7


def test_every_kind_has_a_protocol_the_built_ins_satisfy(tok) -> None:
    from rlcore import protocols
    from rlcore.algorithms.advantages import GRPOAdvantage
    from rlcore.envs import Env
    from rlcore.rollout import RolloutScheduler

    assert set(protocols.PROTOCOLS) == set(protocols.KIND_OPTIONS) == {
        "scheduler", "sampler", "env", "reward", "loss", "advantage"}
    sampler = ScriptedSampler(["x"], tok)
    assert isinstance(sampler, protocols.SamplerLike)
    assert isinstance(RolloutScheduler(sampler, tokenizer=tok), protocols.SchedulerLike)
    assert isinstance(Env(), protocols.EnvLike)
    assert isinstance(rlcore.get("reward", "env_reward"), protocols.RewardLike)
    assert isinstance(rlcore.get("loss", "dapo"), protocols.LossLike)
    assert isinstance(GRPOAdvantage(), protocols.AdvantageLike)
    assert not isinstance(object(), protocols.SamplerLike)
    for field in protocols.KIND_OPTIONS.values():  # every kind has its options field
        assert field in rlcore.GRPOConfig.__dataclass_fields__


def test_update_weights_has_one_signature(tok) -> None:
    sampler = ScriptedSampler(["x"], tok)
    assert sampler.update_weights({}, version=7) is None and sampler.policy_version == 7
    sampler.update_weights({})
    assert sampler.policy_version == 8
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rlcore.get("sampler", "hf").shares_trainer_module is True
        assert rlcore.get("sampler", "openai").shares_trainer_module is False


def test_env_calls_in_flight_have_their_own_name(tok) -> None:
    sched = EnvScheduler(ScriptedSampler(["x"], tok), max_env_calls=5)
    assert sched.max_env_calls == 5
    with pytest.warns(FutureWarning, match="max_concurrent_envs is deprecated for env schedulers: use max_env_calls"):
        old = EnvScheduler(ScriptedSampler(["x"], tok), max_concurrent_envs=7)
    assert old.max_env_calls == 7 and old.max_concurrent_envs == 7


def test_the_loop_policy_takes_the_losss_declared_knobs(tiny_model_dir) -> None:
    from rlcore.loop import Policy

    policy = Policy(tiny_model_dir, loss="sapo", sapo_temperature_pos=1.3, epsilon=0.1)
    cfg = policy.loss_config(num_items=5)
    assert (cfg.sapo_temperature_pos, cfg.sapo_temperature_neg, cfg.epsilon, cfg.num_items) == (1.3, 1.05, 0.1, 5)
    with pytest.raises(ConfigError, match="unknown options: sapo_temp;"):
        Policy(tiny_model_dir, loss="sapo", sapo_temp=1.3)
    with pytest.raises(ConfigError, match="unknown options: sapo_temperature_pos"):
        Policy(tiny_model_dir, loss="grpo", sapo_temperature_pos=1.3)  # grpo declares no such knob


def test_env_options_reach_the_env_under_an_env_scheduler(package, tok, tmp_path) -> None:
    from rlcore.training.components import make_scheduler

    args = rlcore.GRPOConfig(output_dir=str(tmp_path), scheduler="env_scheduler", report_to=[],
                             env_options={"env": "parrot", "word": "fig", "env_timeout": 5},
                             scheduler_options={"env_kwargs": {"bonus": 2.0}})
    sched = make_scheduler(args, ScriptedSampler(["fig"], tok), tok)
    assert sched.env == "parrot" and sched.env_timeout == 5  # the scheduler's own keys stay its options
    assert sched.env_kwargs == {"word": "fig", "bonus": 2.0}  # the env's own reach the env
    env = sched.make_env(_parrot_prompts()[0])
    assert (env.word, env.bonus) == ("fig", 2.0)
    args = rlcore.GRPOConfig(output_dir=str(tmp_path), scheduler="multi_turn", env_options={"max_turns": 2}, report_to=[])
    assert make_scheduler(args, ScriptedSampler(["x"], tok), tok).max_turns == 2  # other schedulers: as before
