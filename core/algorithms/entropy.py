"""The entropy bonus: ``loss = policy_loss − coef · H``, with TRL 1.16's static ``entropy_coef`` and
its adaptive control (``use_adaptive_entropy``, Skywork-OR1).

What the numbers mean, matched to ``trl/trainer/grpo_trainer.py`` (1.16, ``_compute_loss``):

- ``H`` is the mean per-token entropy (nats, of the temperature-scaled distribution) over the tokens
  the policy loss trains on — the completion mask, narrowed by ``top_entropy_quantile`` when that is
  below 1 — summed and divided by their count in the micro-batch. It is *not* normalised like the
  chosen ``loss_type``'s policy term, so ``entropy_coef`` means the same for every loss; it is
  divided by gradient accumulation like every other term.
- Adaptive control keeps ``coef`` in ``[coef_min, coef_max]``. At every optimizer-step boundary
  (the last micro-batch of a gradient-accumulation window) it measures the token-weighted mean
  entropy of the whole window, summed over every data-parallel process, and moves ``coef`` by
  ``delta``: up when that entropy is at or below ``target``, down otherwise. The bonus is applied
  (with the coefficient of the previous boundary, the same for every micro-batch of a window) only
  while the last measured entropy is at or below ``target``; before the first measurement it is
  not applied.
- Evaluation applies the bonus to its loss but never moves the controller.

The state that a resume must restore — ``coef`` and the last measured entropy — is
:meth:`EntropyBonus.state_dict`; checkpoints are written at optimizer-step boundaries, where the
window is empty.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import attrs

from ..errors import ConfigError

if TYPE_CHECKING:  # torch loads on first use: the config checks run without it
    import torch

#: the GRPOConfig / Policy fields, TRL's names and defaults
FIELDS: dict[str, Any] = {
    "entropy_coef": 0.0, "use_adaptive_entropy": False, "entropy_coef_min": 0.0, "entropy_coef_max": 1.0,
    "entropy_coef_delta": 0.005, "entropy_target": 0.2,
}


def check_entropy_settings(values: Any) -> None:
    """One ConfigError line naming the field for an entropy setting that cannot work: a negative or
    non-finite coefficient, bound, step or target, ``entropy_coef_min > entropy_coef_max``, or (with
    adaptive control) a starting ``entropy_coef`` outside its bounds. ``values``: anything with the
    :data:`FIELDS` as attributes (missing ones take TRL's defaults)."""
    get = {k: getattr(values, k, d) for k, d in FIELDS.items()}
    for name in ("entropy_coef", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target"):
        v = get[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            what = {"entropy_coef": "a bonus weight (a negative one would penalise entropy)",
                    "entropy_target": "an entropy in nats"}.get(name, "an adaptive-entropy setting")
            raise ConfigError(f"{name} must be a finite number >= 0 ({what}), got {v!r}")
    if get["entropy_coef_min"] > get["entropy_coef_max"]:
        raise ConfigError(f"entropy_coef_min={get['entropy_coef_min']!r} is above entropy_coef_max={get['entropy_coef_max']!r}; "
                          "the adaptive coefficient needs min <= max")
    if get["use_adaptive_entropy"] and not get["entropy_coef_min"] <= get["entropy_coef"] <= get["entropy_coef_max"]:
        raise ConfigError(f"entropy_coef={get['entropy_coef']!r} (the adaptive coefficient's start) is outside "
                          f"[entropy_coef_min, entropy_coef_max] = [{get['entropy_coef_min']!r}, {get['entropy_coef_max']!r}]")


@attrs.define
class EntropyBonus:
    """The entropy bonus of one run: its coefficient and, with ``adaptive``, the controller state.

    ``observe`` each training micro-batch's (entropy sum, token count); ``step`` at each
    optimizer-step boundary; ``applied_coef`` is what the loss multiplies ``H`` by.
    """

    coef: float = 0.0
    adaptive: bool = False
    coef_min: float = 0.0
    coef_max: float = 1.0
    delta: float = 0.005
    target: float = 0.2
    #: the world-mean entropy measured at the last optimizer step (inf: none yet, bonus off)
    last_entropy: float = math.inf
    window: torch.Tensor | None = attrs.field(default=None, init=False, repr=False)

    @classmethod
    def from_args(cls, args: Any) -> "EntropyBonus | None":
        """From a GRPOConfig (or anything with TRL's field names); ``None`` when the bonus is off
        (``entropy_coef`` 0 without adaptive control) — the loss then keeps no entropy gradient."""
        check_entropy_settings(args)
        v = {k: getattr(args, k, d) for k, d in FIELDS.items()}
        if float(v["entropy_coef"]) == 0.0 and not v["use_adaptive_entropy"]:
            return None
        return cls(coef=float(v["entropy_coef"]), adaptive=bool(v["use_adaptive_entropy"]),
                   coef_min=float(v["entropy_coef_min"]), coef_max=float(v["entropy_coef_max"]),
                   delta=float(v["entropy_coef_delta"]), target=float(v["entropy_target"]))

    @property
    def applied_coef(self) -> float:
        """The coefficient this window's micro-batches apply: ``coef``, or under adaptive control
        ``coef`` only while the last measured entropy is at or below ``target`` (else 0)."""
        if self.adaptive and not self.last_entropy <= self.target:
            return 0.0
        return self.coef

    def observe(self, entropy_sum: torch.Tensor, tokens: torch.Tensor) -> None:
        """Add one training micro-batch's masked entropy sum and token count to the window."""
        if not self.adaptive:
            return
        import torch

        stats = torch.stack([entropy_sum.detach().float(), tokens.detach().float()])
        self.window = stats if self.window is None else self.window + stats

    def step(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> float:
        """The optimizer-step boundary: measure the window's entropy (``reduce`` sums the window
        over data-parallel processes), move ``coef`` by ``delta`` and clear the window. Returns
        ``coef``. Static control: nothing moves."""
        if not self.adaptive or self.window is None:
            return self.coef
        window = reduce(self.window) if reduce is not None else self.window
        entropy = float(window[0] / window[1].clamp(min=1.0))
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.coef_max)
        else:
            self.coef = max(self.coef - self.delta, self.coef_min)
        self.last_entropy = entropy
        self.window = None
        return self.coef

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe controller state (``last_entropy`` inf is written as ``null``)."""
        return {"entropy_coef": self.coef,
                "last_world_entropy": self.last_entropy if math.isfinite(self.last_entropy) else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.coef = float(state["entropy_coef"])
        last = state.get("last_world_entropy")
        self.last_entropy = math.inf if last is None else float(last)
        self.window = None


def entropy_bonus_term(entropy: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(H, entropy sum, token count)`` over ``mask``: ``H`` the mean per-token entropy the bonus
    multiplies (with gradient when ``entropy`` has it), TRL's ``entropy_loss`` before accumulation."""
    m = mask.to(entropy.dtype)
    total = (entropy * m).sum()
    count = m.sum()
    return total / count.clamp(min=1.0), total, count
