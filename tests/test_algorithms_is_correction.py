"""Rollout importance-sampling correction against hand-computed ratios."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.algorithms.is_correction import importance_weights
from rlcore.errors import ConfigError


def _data():
    trainer = torch.log(torch.tensor([[0.5, 0.5, 0.2, 0.9], [0.3, 0.6, 0.1, 0.1]]))
    sampler = torch.log(torch.tensor([[0.25, 0.5, 0.4, 0.1], [0.3, 0.2, 0.1, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    return trainer, sampler, mask


def test_token_truncate_and_mask() -> None:
    tr, sp, mask = _data()
    w, stats = importance_weights(tr, sp, mask, mode="token_truncate", threshold=2.5)
    assert torch.allclose(w[0, :3], torch.tensor([2.0, 1.0, 0.5]))
    assert w[0, 3] == 1.0  # masked position: diff zeroed, ratio 1
    assert torch.allclose(w[1, :2], torch.tensor([1.0, 2.5]))  # 3.0 truncated
    assert stats["is_ratio/max"] == pytest.approx(3.0, rel=1e-5)
    w, stats = importance_weights(tr, sp, mask, mode="token_mask", threshold=2.5)
    assert w[1, 1] == 0.0 and w[0, 0] == pytest.approx(2.0)
    assert stats["is_ratio/dropped_frac"] == pytest.approx(1 / 5)


def test_sequence_modes_and_invalid_rows() -> None:
    tr, sp, mask = _data()
    w, _ = importance_weights(tr, sp, mask, mode="sequence_truncate", threshold=5.0)
    assert w.shape == (2, 1)
    assert w[0, 0] == pytest.approx(1.0)  # 2 * 1 * .5
    assert w[1, 0] == pytest.approx(3.0, rel=1e-5)
    w, _ = importance_weights(tr, sp, mask, mode="sequence_mask", threshold=2.0, is_valid=torch.tensor([True, False]))
    assert w[0, 0] == pytest.approx(1.0)
    assert w[1, 0] == 1.0  # incomplete logprobs: correction off, not masked
    w, _ = importance_weights(tr, sp, mask, mode="sequence_mask", threshold=2.0)
    assert w[1, 0] == 0.0


def test_unknown_mode_is_config_error() -> None:
    tr, sp, mask = _data()
    with pytest.raises(ConfigError, match="token_truncate"):
        importance_weights(tr, sp, mask, mode="tokens")
    assert not math.isnan(importance_weights(tr, sp, mask * 0, mode="token_mask")[1]["is_ratio/mean"])
