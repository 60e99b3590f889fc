"""Which vLLM versions rlcore supports, and the one logprob semantics sampler and trainer share.

Both vLLM backends (``vllm`` in process, ``openai``/``vllm_server`` over HTTP) use this module so
they accept and refuse exactly the same requests. Nothing here imports vLLM.

**The semantics.** The logprob of a sampled token is ``log_softmax(logits / T)[token]`` of the
model's logits (``T = 1`` for greedy), before repetition penalty, min-tokens masking and top-k /
top-p / min-p truncation. The trainer recomputes exactly this (``rlcore.algorithms.logprobs``
divides the logits by the same temperature), so importance-sampling ratios compare like with like.

**What vLLM returns** (read from ``vllm/v1/sample/sampler.py`` and
``vllm/v1/sample/ops/topk_topp_sampler.py`` of each version):

- ``raw_logprobs`` (vLLM's default, every version): ``log_softmax(logits)`` before anything else —
  equal to ours when ``T`` is 0 or 1, whatever the truncation and penalties.
- ``processed_logprobs`` on 0.10.0–0.10.1: after penalties and min-tokens masking, **before**
  temperature — equal to ours when ``T`` is 0 or 1 and no penalty / min-tokens is active.
- ``processed_logprobs`` from 0.10.2: after penalties, min-tokens, temperature, min-p and top-k /
  top-p, renormalised over the kept tokens — equal to ours for any ``T`` when no truncation,
  penalty or min-tokens is active. On 0.10.2 only, a greedy row batched with sampled rows is
  divided by a temperature of -1 (``gpu_input_batch.py`` stores -1.0 for greedy; fixed to 0.0 with
  a guard in ``apply_temperature`` in 0.11), so greedy requests are refused there.

Every other combination would silently bias the importance weights, so :func:`logprob_mismatch`
names it and the backends refuse the request with that line.
"""

from __future__ import annotations

import re

from ...types import SamplingParams

#: the range the backends were checked against (read from the wheels' source; see docs/samplers.md)
SUPPORTED_RANGE = ">=0.10.2,<0.34"
MIN_VERSION = (0, 10, 2)
MAX_VERSION_EXCLUSIVE = (0, 34, 0)
RAW, PROCESSED = "raw_logprobs", "processed_logprobs"
LOGPROBS_MODES = (RAW, PROCESSED)


def parse_version(version: str | None) -> tuple[int, int, int] | None:
    """``"0.10.1.1"`` / ``"0.11.0rc2+cu128"`` → ``(0, 10, 1)``; ``None`` when unreadable."""
    if not version:
        return None
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def _vstr(version: tuple[int, int, int] | None) -> str:
    return ".".join(map(str, version)) if version else "unknown"


def active_processing(params: SamplingParams) -> list[str]:
    """The request's settings that change vLLM's processed logprobs besides temperature."""
    active = []
    if params.top_k and params.top_k > 0:
        active.append(f"top_k={params.top_k}")
    if params.top_p < 1.0:
        active.append(f"top_p={params.top_p}")
    if params.min_p > 0.0:
        active.append(f"min_p={params.min_p}")
    if params.repetition_penalty != 1.0:
        active.append(f"repetition_penalty={params.repetition_penalty}")
    if params.min_tokens > 0:
        active.append(f"min_tokens={params.min_tokens}")
    return active


def logprob_mismatch(params: SamplingParams, mode: str | None, version: tuple[int, int, int] | None) -> str | None:
    """Why vLLM's logprobs for ``params`` would differ from the trainer's, or ``None`` if they agree.

    ``mode`` is the engine's ``logprobs_mode`` (``None``: vLLM's default, raw). ``version`` is the
    engine's vLLM version (``None``: assume the newest supported behaviour).
    """
    mode = mode or RAW
    t = params.temperature
    unit_t = t == 0.0 or t == 1.0
    if mode == RAW:
        if unit_t:
            return None
        return (
            f"vLLM returns raw logprobs (logprobs_mode={RAW}), which ignore temperature={t}, while the trainer "
            f"divides the logits by it; use logprobs_mode={PROCESSED} (vLLM >= 0.10.2) or temperature 1"
        )
    if mode != PROCESSED:
        return f"vLLM logprobs_mode={mode} returns logits, not logprobs; use {PROCESSED} or {RAW}"
    active = active_processing(params)
    if version is not None and version < (0, 10, 2):
        if unit_t and not [a for a in active if a.startswith(("repetition_penalty", "min_tokens"))]:
            return None
        return (
            f"vLLM {_vstr(version)} computes {PROCESSED} before temperature and after penalties, so they cannot "
            f"match the trainer's log_softmax(logits / {t}); upgrade vLLM to {SUPPORTED_RANGE}"
        )
    if active:
        return (
            f"{', '.join(active)} make vLLM's {PROCESSED} renormalise over the kept tokens (or add penalties), "
            f"which the trainer does not compute; turn them off, or sample at temperature 1 with "
            f"logprobs_mode={RAW}"
        )
    if t == 0.0 and version is not None and (0, 10, 2) <= version < (0, 11, 0):
        return (
            f"vLLM {_vstr(version)} returns wrong {PROCESSED} for greedy requests batched with sampled ones "
            f"(fixed in 0.11); upgrade vLLM, or sample greedily with logprobs_mode={RAW}"
        )
    return None


class SleepState:
    """Which parts of a vLLM engine sleep (vLLM's tags ``weights``, ``kv_cache``), at which level,
    and whether level 2 discarded the weights: the bookkeeping both vLLM-backed samplers share (the
    in-process ``vllm`` one and ``openai`` against a server), so they refuse, wake and resync alike."""

    ALL = frozenset({"weights", "kv_cache"})

    def __init__(self) -> None:
        self.parts: set[str] = set()
        self.level = 0
        self.weights_discarded = False

    def __bool__(self) -> bool:
        return bool(self.parts)

    def fell_asleep(self, level: int) -> None:
        self.parts, self.level = set(self.ALL), level
        if level == 2:
            self.weights_discarded = True

    def wake_tags(self) -> list[str] | None:
        """What to wake: ``None`` when everything sleeps (wake it all), else the parts still asleep
        (``update_weights`` already woke the weights)."""
        return None if self.parts == self.ALL else sorted(self.parts)

    def woke(self) -> None:
        self.parts.clear()
        self.level = 0


class SleepStateMixin:
    """``is_sleeping`` and ``sleep_level`` read off a sampler's :class:`SleepState` (``self._sleep``)."""

    _sleep: SleepState

    @property
    def is_sleeping(self) -> bool:
        return bool(self._sleep)

    @property
    def sleep_level(self) -> int:
        return self._sleep.level
