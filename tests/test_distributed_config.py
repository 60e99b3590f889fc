"""Distributed pieces that need no Ray cluster: layout config, CLI flags, routing, the staleness
filter, weight export (plain / LoRA), the gloo broadcast group, and the missing-Ray error."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from rlcore.distributed import DistributedConfig, WorkerGroupConfig, filter_stale
from rlcore.commands.distributed import split_distributed_flags
from rlcore.distributed.routing import Router
from rlcore.errors import ConfigError, MissingDependencyError
from rlcore.types import Trajectory


# --- config -------------------------------------------------------------------------------------
def test_group_bundles_and_validation():
    assert WorkerGroupConfig(num_cpus=0.5).bundle() == {"CPU": 0.5}
    assert WorkerGroupConfig(device="gpu", num_cpus=2).bundle() == {"CPU": 2.0, "GPU": 1.0}
    cfg = DistributedConfig(trainer=WorkerGroupConfig(num_workers=2, num_cpus=0.5),
                            sampler=WorkerGroupConfig(num_workers=3, num_cpus=0.5)).validate()
    assert cfg.total_cpus == 2.5 and cfg.total_gpus == 0 and cfg.resolved_weight_sync == "object_store"
    with pytest.raises(ConfigError, match="sampler group needs at least 1 worker"):
        DistributedConfig(sampler=WorkerGroupConfig(num_workers=0)).validate()
    with pytest.raises(ConfigError, match="weight_sync='nccl' needs both"):
        DistributedConfig(weight_sync="nccl").validate()
    with pytest.raises(ConfigError, match="max_staleness"):
        DistributedConfig(max_staleness=-1).validate()


def test_config_from_mapping_rejects_unknown_keys():
    cfg = DistributedConfig.from_dict({"trainer": {"num_workers": 2}, "sampler": {"num_workers": 4, "num_cpus": 0.25},
                                       "async_generation": True, "max_staleness": 2})
    assert (cfg.trainer.num_workers, cfg.sampler.num_workers, cfg.sampler.num_cpus) == (2, 4, 0.25)
    assert cfg.async_generation and cfg.max_staleness == 2
    with pytest.raises(ConfigError, match="unknown key\\(s\\) in distributed.sampler: workers"):
        DistributedConfig.from_dict({"sampler": {"workers": 2}})


# --- CLI flags ----------------------------------------------------------------------------------
def test_cli_flags_build_the_layout_and_leave_the_rest():
    cfg, rest = split_distributed_flags([
        "--distributed", "ray", "--num-trainer-workers", "2", "--num-sampler-workers=3", "--max-steps", "5",
        "--async-generation", "--max-staleness", "2", "--ray-address", "10.0.0.1:6379", "--cpus-per-worker", "0.5",
        "--worker-device", "cpu",
    ])
    assert rest == ["--max-steps", "5"]
    assert cfg.trainer.num_workers == 2 and cfg.sampler.num_workers == 3 and cfg.sampler.num_cpus == 0.5
    assert cfg.async_generation and cfg.max_staleness == 2 and cfg.address == "10.0.0.1:6379"
    assert split_distributed_flags(["--max-steps", "5"]) == (None, ["--max-steps", "5"])
    with pytest.raises(ConfigError, match="--num-trainer-workers needs --distributed ray"):
        split_distributed_flags(["--num-trainer-workers", "2"])
    with pytest.raises(ConfigError, match="--distributed 'mpi' is not supported"):
        split_distributed_flags(["--distributed", "mpi"])
    with pytest.raises(ConfigError, match="--num-sampler-workers must be a number"):
        split_distributed_flags(["--distributed", "ray", "--num-sampler-workers", "two"])


def test_rlcore_train_reports_a_flag_error_in_one_line(capsys):
    from rlcore.commands.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["train", "--num-sampler-workers", "2"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == "Error: --num-sampler-workers needs --distributed ray"


def test_missing_ray_is_one_line_with_the_install_hint(monkeypatch):
    from rlcore.distributed.runtime import require_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # fault injection: Ray not installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlcore\[ray\]'"):
        require_ray()


# --- routing ------------------------------------------------------------------------------------
def test_router_least_loaded_then_sticky_then_failover():
    r = Router(3)
    r.inflight = [2, 0, 1]
    assert r.pick("a") == 1  # least in flight
    r.inflight = [0, 5, 5]
    assert r.pick("a") == 1  # sticky even though 0 is now idle
    assert r.pick("b") == 0
    r.mark_dead(1)
    assert r.pick("a") in (0, 2) and r.worker_of("a") != 1  # moved to a live worker
    r.alive.clear()
    with pytest.raises(LookupError):
        r.pick("c")


async def test_router_keys_by_asyncio_task_without_a_bound_uuid():
    from rlcore.distributed.routing import current_key

    async def key():
        return current_key()

    k1, k2 = await asyncio.gather(key(), key())
    assert k1 is not None and k2 is not None and k1 is not k2


# --- staleness ----------------------------------------------------------------------------------
def test_filter_stale_drops_whole_groups_by_their_oldest_member():
    def traj(group, version):
        return Trajectory(prompt_ids=[1], group_id=group, policy_version=version)

    trajs = [traj("a", 5), traj("a", 4), traj("b", 3), traj("b", 3), traj("c", 2), traj("c", 5)]
    kept, dropped = filter_stale(trajs, current_version=5, max_staleness=2)
    assert [t.group_id for t in kept] == ["a", "a", "b", "b"]
    assert [t.group_id for t in dropped] == ["c", "c"]  # one member 3 versions old drops the group
    kept, dropped = filter_stale(trajs, current_version=5, max_staleness=0)
    assert kept == [] and len(dropped) == 6


# --- weight export --------------------------------------------------------------------------------
def test_export_plain_model_sends_parameters_once(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rlcore.sampling.weight_export import export_weights

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    weights, lora = export_weights(model, sampler_accepts_lora=True)
    assert not lora and set(weights) == {n for n, _ in model.named_parameters()}
    assert all(w.device.type == "cpu" for w in weights.values())


def test_export_lora_adapters_or_merged_weights(tiny_model_dir):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlcore.sampling.weight_export import export_weights

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    plain_names = {n for n, _ in base.named_parameters()}
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)  # make the adapters matter
    adapters, lora = export_weights(model, sampler_accepts_lora=True)
    assert lora and adapters and all("lora_" in n for n in adapters)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    merged, lora = export_weights(model, sampler_accepts_lora=False)
    assert not lora and set(merged) == plain_names
    # the trainer's module is untouched, and the merged weights are the trained policy
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    plain.load_state_dict(merged, strict=False)
    with torch.no_grad():
        got = plain(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)


# --- the broadcast group (NCCL on GPU; the same code with gloo here) -----------------------------
def test_broadcast_group_sends_named_tensors_to_every_rank():
    import torch

    from rlcore.distributed.collective import BroadcastGroup, free_port, specs_of

    port = free_port()
    sent = {"a.weight": torch.randn(3, 4), "b.bias": torch.arange(5, dtype=torch.float64), "c": torch.ones(2, 2)}
    received: dict[int, dict] = {}
    specs = specs_of(list(sent.items()))

    def rank(r: int) -> None:
        group = BroadcastGroup(f"tcp://127.0.0.1:{port}", r, 3, "gloo", timeout_s=30)
        if r == 0:
            assert group.send(sent.items()) == specs
        else:
            received[r] = group.receive(specs)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(received) == {1, 2}
    for got in received.values():
        assert set(got) == set(sent)
        assert all(torch.equal(got[n], sent[n]) for n in sent)


@pytest.mark.parametrize("spg,ga,iters,want", [(4, 4, 1, 1), (8, 4, 1, 2), (4, 4, 2, 2), (1, 1, 1, 1), (2, 4, 1, 1)])
def test_prefetch_counts_optimizer_steps_per_generation(spg, ga, iters, want):
    """steps_per_generation counts micro-steps (TRL's meaning): one generation batch moves
    global_step by spg × num_iterations / gradient_accumulation_steps optimizer steps, and the
    async prefetch stops only when that reaches max_steps."""
    from types import SimpleNamespace

    from rlcore.distributed.dp_trainer import RayGRPOTrainer

    args = SimpleNamespace(steps_per_generation=spg, gradient_accumulation_steps=ga, num_iterations=iters)
    assert RayGRPOTrainer.optimizer_steps_per_generation.fget(SimpleNamespace(args=args)) == want
