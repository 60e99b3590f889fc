"""Run the GSM8K example (seed 001) from Python: ``python examples/gsm8k/train.py [--set key=value ...]``.

``rlcore train --config examples/gsm8k/config.yaml`` runs the same recipe; this script exists so
the example also runs where only the Python API is wanted, and is what the example's test calls.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
RUN_KEYS = ("model", "dataset", "prompt_column", "system_prompt")


def load_config(path: str | os.PathLike[str] = HERE / "config.yaml", **overrides: Any) -> dict[str, Any]:
    """The YAML config with ``overrides`` applied; a relative ``dataset`` path is taken from the
    repository root (where the example is documented to run from)."""
    with open(path, encoding="utf-8") as f:
        cfg: dict[str, Any] = yaml.safe_load(f) or {}
    cfg.update(overrides)
    ds = str(cfg.get("dataset") or "")
    if ds and not os.path.isabs(ds) and (REPO_ROOT / ds).exists():
        cfg["dataset"] = str(REPO_ROOT / ds)
    return cfg


def train(cfg: dict[str, Any]) -> Any:
    """Build a GRPOTrainer from the config dict and train. Returns the trainer."""
    from rlcore.trainer.grpo import GRPOConfig, GRPOTrainer
    from rlcore.data import load_rows

    run = {k: cfg.pop(k, None) for k in RUN_KEYS}
    args = GRPOConfig(**cfg)
    trainer = GRPOTrainer(
        run["model"],
        args=args,
        train_dataset=load_rows(run["dataset"]),
        prompt_column=run["prompt_column"],
        system_prompt=run["system_prompt"],
    )
    trainer.train()
    return trainer


def _value(text: str) -> Any:
    return yaml.safe_load(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=str(HERE / "config.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    ns = parser.parse_args(argv)
    overrides = {}
    for item in ns.set:
        key, _, val = item.partition("=")
        overrides[key.strip()] = _value(val)
    train(load_config(ns.config, **overrides))


if __name__ == "__main__":
    main()
