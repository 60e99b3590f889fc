"""Built-in losses and advantage estimators, registered like any third-party plugin's.

Factories are "module:attr" strings so loading plugins never imports torch.
"""

from __future__ import annotations

from typing import Callable

from ..hookspecs import hookimpl

_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "luspo", "vespo", "opd")


@hookimpl
def register_losses(register: Callable[..., None]) -> None:
    for name in _LOSSES:
        register(name, f"rlcore.algorithms.losses:{name}_loss")


@hookimpl
def register_advantages(register: Callable[..., None]) -> None:
    register("grpo", "rlcore.algorithms.advantages:GRPOAdvantage")
    register("rloo", "rlcore.algorithms.advantages:RLOOAdvantage")
    register("reinforce_plus_plus", "rlcore.algorithms.advantages:ReinforcePPAdvantage", aliases=("reinforce++",))
    register("gigpo", "rlcore.algorithms.advantages:GiGPOAdvantage")
