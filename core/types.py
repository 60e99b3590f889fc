"""The data that flows through a run (token-in / token-out), as attrs classes.

A :class:`Trajectory` is what a scheduler runs (ms-swift's schedulers read it as their
``infer_request``: ``.messages``, ``.data_dict``, ``.uuid``); a :class:`Completion` is one sample,
which the scheduler's hooks see through :class:`rlcore.rollout.ResponseChoice` (``.message.content``,
``.finish_reason``, ``.token_ids``, ``.logprobs``).
"""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any, Iterable, Literal

import attrs

FinishReason = Literal["stop", "length", "abort"]
Status = Literal["running", "ok", "truncated", "failed"]


@attrs.define
class SamplingParams:
    """What to sample. Logprobs of the sampled tokens are always returned by every backend."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    n: int = 1
    seed: int | None = None
    stop: list[str] = attrs.field(factory=list)
    stop_token_ids: list[int] = attrs.field(factory=list)
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    #: logprobs per token, vLLM's name: the sampled token's is always returned, so 1 (or 0/None,
    #: accepted for scripts that pass vLLM's values) — top-k alternatives are not returned
    logprobs: int | None = attrs.field(default=1)

    @logprobs.validator
    def _one_logprob(self, _attr: Any, value: Any) -> None:
        if value not in (None, 0, 1):
            from .errors import ConfigError

            raise ConfigError(f"SamplingParams(logprobs={value!r}): rlcore's samplers return the sampled token's "
                              "logprob only; pass logprobs=1 (or leave it out)")

    def replace(self, **changes: Any) -> "SamplingParams":
        return attrs.evolve(self, **changes)


@attrs.define
class ChatMessage:
    role: str
    content: str


@attrs.define
class Completion:
    """One sampled continuation: its tokens, their logprobs under the sampler, and why it stopped."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str = "stop"
    text: str = ""
    #: free-form backend details (e.g. request id, cached tokens)
    meta: dict[str, Any] = attrs.field(factory=dict)

    @property
    def message(self) -> ChatMessage:
        """ms-swift's ``response_choice.message``."""
        return ChatMessage(role="assistant", content=self.text)

    @property
    def logprobs_complete(self) -> bool:
        return self.logprobs is not None and len(self.logprobs) == len(self.token_ids) and all(
            lp is not None for lp in self.logprobs
        )


@attrs.define
class Turn:
    """A run of tokens appended to a trajectory: a sampled completion (loss_mask 1, with logprobs) or an
    observation/tip/tool result appended by the scheduler (loss_mask 0, logprobs None)."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float | None]
    role: str = "assistant"  # "assistant" for sampled text, else "user"/"tool"/"observation"/"tip"/"prompt"
    text: str = ""
    finish_reason: str | None = None
    #: a ``"prompt"`` turn only: how many leading messages its tokens render (see :meth:`restart`)
    messages: int | None = None

    def __attrs_post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"Turn has {n} tokens but {len(self.loss_mask)} mask values and {len(self.logprobs)} logprobs; "
                "they must be the same length"
            )

    @classmethod
    def sampled(cls, completion: Completion) -> "Turn":
        lps: list[float | None]
        if completion.logprobs is not None and len(completion.logprobs) == len(completion.token_ids):
            lps = list(completion.logprobs)
        else:
            lps = [None] * len(completion.token_ids)
        return cls(
            token_ids=list(completion.token_ids),
            loss_mask=[1] * len(completion.token_ids),
            logprobs=lps,
            role="assistant",
            text=completion.text,
            finish_reason=completion.finish_reason,
        )

    @classmethod
    def observation(cls, token_ids: Iterable[int], role: str = "user", text: str = "") -> "Turn":
        ids = list(token_ids)
        return cls(token_ids=ids, loss_mask=[0] * len(ids), logprobs=[None] * len(ids), role=role, text=text)

    @classmethod
    def restart(cls, token_ids: Iterable[int], *, messages: int, text: str = "") -> "Turn":
        """A new per-turn sample starts here (``multi_turn_mode`` ``per_turn``/``auto``): its tokens
        are the whole prompt the sampler is given for the next turn, the template's rendering of the
        first ``messages`` messages with the generation prompt. Loss mask 0; the trainer scores
        them as that sample's prompt, never after the tokens before them."""
        ids = list(token_ids)
        return cls(token_ids=ids, loss_mask=[0] * len(ids), logprobs=[None] * len(ids), role=PROMPT_ROLE, text=text,
                   messages=int(messages))

    @property
    def is_restart(self) -> bool:
        return self.role == PROMPT_ROLE and self.messages is not None


#: Turn.role of a per-turn sample's prompt (see :meth:`Turn.restart`)
PROMPT_ROLE = "prompt"


def _new_uuid() -> str:
    return uuidlib.uuid4().hex


@attrs.define
class Trajectory:
    """One rollout: the prompt tokens, then every appended turn, plus rewards and status.

    The tokens the trainer scores are exactly ``prompt_ids + completion_ids``.
    """

    prompt_ids: list[int]
    messages: list[dict[str, Any]] = attrs.field(factory=list)
    data: dict[str, Any] = attrs.field(factory=dict)
    uuid: str = attrs.field(factory=_new_uuid)
    group_id: str = ""
    turns: list[Turn] = attrs.field(factory=list)
    step_rewards: list[float] = attrs.field(factory=list)
    rewards: dict[str, float | None] = attrs.field(factory=dict)
    reward: float | None = None
    infos: dict[str, Any] = attrs.field(factory=dict)
    status: str = "running"
    reason: str | None = None
    num_turns: int = 0
    policy_version: int = 0

    # --- ms-swift compatible names -------------------------------------------------------------
    @property
    def data_dict(self) -> dict[str, Any]:
        return self.data

    # --- flat views -------------------------------------------------------------------------------
    @property
    def completion_ids(self) -> list[int]:
        return [t for turn in self.turns for t in turn.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        return [m for turn in self.turns for m in turn.loss_mask]

    @property
    def logprobs(self) -> list[float | None]:
        return [lp for turn in self.turns for lp in turn.logprobs]

    @property
    def input_ids(self) -> list[int]:
        """Every token in order: ``prompt_ids + completion_ids``. With per-turn samples (a
        ``"prompt"`` turn inside, see :meth:`Turn.restart`) this is not one sequence the model saw:
        use :meth:`turn_samples` (the trainer does) or :attr:`sample_input_ids`."""
        return list(self.prompt_ids) + self.completion_ids

    @property
    def sample_input_ids(self) -> list[int]:
        """The tokens of the sample being built: what the sampler is given for the next turn (all
        of :attr:`input_ids` unless a per-turn sample started, then that sample's prompt and on)."""
        for k in range(len(self.turns) - 1, -1, -1):
            if self.turns[k].is_restart:
                return [t for turn in self.turns[k:] for t in turn.token_ids]
        return self.input_ids

    @property
    def has_turn_samples(self) -> bool:
        return any(t.is_restart for t in self.turns)

    def turn_samples(self) -> list["Trajectory"]:
        """The sequences the trainer scores: ``[self]``, or, where per-turn samples started (a template
        that is not prefix-preserving, ``multi_turn_mode``), one view per sample: its prompt the exact
        tokens the sampler was given, its turns what followed up to the next sample, its messages the
        conversation up to its last assistant message. Views share the episode's uuid, group,
        rewards and data (one episode, one advantage); the last keeps the episode's status.

        A sample whose conversation is not the episode's final one (an agent that rewrote its
        history: the new sample renders messages the earlier ones never had) finds its own in
        ``infos["sample_messages"][k]`` (``None`` or absent: the final ``messages``)."""
        cuts = [i for i, t in enumerate(self.turns) if t.is_restart]
        if not cuts:
            return [self]
        out: list[Trajectory] = []
        starts = [-1] + cuts
        own = self.infos.get("sample_messages")

        def conversation(k: int) -> list[dict[str, Any]]:
            mine = own[k] if isinstance(own, list) and k < len(own) else None
            return mine if isinstance(mine, list) else self.messages

        for k, c in enumerate(starts):
            stop = starts[k + 1] if k + 1 < len(starts) else len(self.turns)
            turns = self.turns[c + 1:stop]
            infos = dict(self.infos)
            infos.pop("sample_messages", None)
            msgs = conversation(k)
            if c < 0:
                prompt = list(self.prompt_ids)
                first = None
            else:
                prompt = list(self.turns[c].token_ids)
                first = int(self.turns[c].messages or 0)
                infos["prompt_messages"] = first
                infos.pop("prompt_truncated", None)
            if k + 1 < len(starts):  # up to the last assistant message this sample holds
                # the next sample's prompt length counts in this one's conversation only when they share it
                upto = int(self.turns[stop].messages or 0) if conversation(k + 1) == msgs else len(msgs)
                while upto > 0 and (msgs[upto - 1].get("role") if upto <= len(msgs) else None) != "assistant":
                    upto -= 1
                messages = msgs[:upto]
                last = next((t for t in reversed(turns) if any(t.loss_mask)), None)
                status = "failed" if self.status == "failed" else (
                    "truncated" if last is not None and last.finish_reason == "length" else "ok")
                reason = self.reason if self.status == "failed" else None
            else:
                messages, status, reason = list(msgs), self.status, self.reason
            trained = infos.get("trained_messages")
            if isinstance(trained, list):
                lo = first if first is not None else -1
                infos["trained_messages"] = [i for i in trained if lo <= i < len(messages)]
            infos["turn_sample"] = k
            out.append(Trajectory(
                prompt_ids=prompt, messages=messages, data=self.data, uuid=self.uuid, group_id=self.group_id,
                turns=list(turns), step_rewards=self.step_rewards, rewards=self.rewards, reward=self.reward,
                infos=infos, status=status, reason=reason,
                num_turns=sum(1 for t in turns if any(t.loss_mask)), policy_version=self.policy_version))
        return out

    @property
    def logprobs_complete(self) -> bool:
        """True when every trained token (mask 1) has a sampler logprob; else IS correction is off for it."""
        return all(lp is not None for turn in self.turns for m, lp in zip(turn.loss_mask, turn.logprobs) if m)

    @property
    def num_completion_tokens(self) -> int:
        return sum(len(t.token_ids) for t in self.turns)

    @property
    def total_reward(self) -> float:
        return float(sum(self.step_rewards))

    @property
    def finished(self) -> bool:
        return self.status != "running"

    def fail(self, reason: str) -> None:
        self.status = "failed"
        self.reason = reason

    # --- JSON ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON form written by ``rlcore rollout`` (one object per line)."""
        return {
            "uuid": self.uuid,
            "group_id": self.group_id,
            "prompt_ids": list(self.prompt_ids),
            "completion_ids": self.completion_ids,
            "loss_mask": self.loss_mask,
            "logprobs": [lp if m else None for m, lp in zip(self.loss_mask, self.logprobs)],
            "turns": [attrs.asdict(t) for t in self.turns],
            "num_turns": self.num_turns,
            "messages": self.messages,
            "data": _jsonable(self.data),
            "step_rewards": list(self.step_rewards),
            "rewards": dict(self.rewards),
            "reward": self.reward,
            "status": self.status,
            "reason": self.reason,
            "infos": _jsonable(self.infos),
            "policy_version": self.policy_version,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        turns = [Turn(**t) for t in d.get("turns", [])]
        if not turns and d.get("completion_ids"):
            ids = d["completion_ids"]
            mask = d.get("loss_mask") or [1] * len(ids)
            lps = d.get("logprobs") or [None] * len(ids)
            turns = [Turn(token_ids=list(ids), loss_mask=list(mask), logprobs=list(lps))]
        return cls(
            prompt_ids=list(d["prompt_ids"]),
            messages=list(d.get("messages", [])),
            data=dict(d.get("data", {})),
            uuid=d.get("uuid") or _new_uuid(),
            group_id=d.get("group_id", ""),
            turns=turns,
            step_rewards=list(d.get("step_rewards", [])),
            rewards=dict(d.get("rewards", {})),
            reward=d.get("reward"),
            infos=dict(d.get("infos", {})),
            status=d.get("status", "ok"),
            reason=d.get("reason"),
            num_turns=d.get("num_turns", 0),
            policy_version=d.get("policy_version", 0),
        )

    @classmethod
    def from_json(cls, line: str) -> "Trajectory":
        return cls.from_dict(json.loads(line))


def _jsonable(obj: Any) -> Any:
    """Best-effort conversion of infos/rows to JSON-safe values (numpy, tensors, sets, objects)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        try:
            return obj.item()
        except Exception:  # noqa: BLE001 - fall through to str
            pass
    return str(obj)


@attrs.define
class Prompt:
    """A dataset row turned into something a scheduler can start from."""

    messages: list[dict[str, Any]]
    prompt_ids: list[int]
    data: dict[str, Any] = attrs.field(factory=dict)
    group_id: str = attrs.field(factory=_new_uuid)
    #: leading tokens of the rendering rlcore cut (max_prompt_length): the only licence for
    #: ``prompt_ids`` that are a suffix of the messages' rendering (trajectories: ``infos["prompt_truncated"]``)
    truncated_tokens: int = 0


@attrs.define
class Batch:
    """Packed, right-padded tensors the loss consumes. Position ``t`` of ``completion_mask``,
    ``sampler_logps`` and ``advantages`` refers to the token ``input_ids[:, t]`` (the token being
    predicted), so logps computed for ``input_ids[:, 1:]`` line up after a shift of one."""

    input_ids: Any  # LongTensor [B, T]
    attention_mask: Any  # LongTensor [B, T]
    completion_mask: Any  # FloatTensor [B, T]: 1 on sampled tokens
    advantages: Any  # FloatTensor [B, T]: per-token advantage (sequence advantage broadcast)
    sampler_logps: Any  # FloatTensor [B, T]: 0 where unknown
    is_valid: Any  # BoolTensor [B]: logprobs complete -> IS correction allowed
    old_logps: Any = None
    ref_logps: Any = None
    teacher_logps: Any = None  # FloatTensor [B, T]: the teacher's logprobs (on-policy distillation)

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @classmethod
    def from_trajectories(
        cls,
        trajectories: list[Trajectory],
        advantages: list[float] | list[list[float]],
        pad_token_id: int,
        device: Any = None,
    ) -> "Batch":
        """Pack trajectories. ``advantages`` is one float per trajectory, or one per completion token."""
        import torch

        lengths = [len(t.prompt_ids) + t.num_completion_tokens for t in trajectories]
        T = max(lengths) if lengths else 0
        B = len(trajectories)
        input_ids = torch.full((B, T), pad_token_id, dtype=torch.long)
        attn = torch.zeros((B, T), dtype=torch.long)
        cmask = torch.zeros((B, T), dtype=torch.float32)
        adv = torch.zeros((B, T), dtype=torch.float32)
        slp = torch.zeros((B, T), dtype=torch.float32)
        valid = torch.zeros(B, dtype=torch.bool)
        for i, (traj, a) in enumerate(zip(trajectories, advantages)):
            ids = traj.input_ids
            p = len(traj.prompt_ids)
            n = len(ids)
            input_ids[i, :n] = torch.tensor(ids, dtype=torch.long)
            attn[i, :n] = 1
            cmask[i, p:n] = torch.tensor(traj.loss_mask, dtype=torch.float32)
            if isinstance(a, (list, tuple)):
                adv[i, p:n] = torch.tensor(a, dtype=torch.float32)
            else:
                adv[i, p:n] = float(a)
            lps = traj.logprobs
            slp[i, p:n] = torch.tensor([lp if lp is not None else 0.0 for lp in lps], dtype=torch.float32)
            valid[i] = traj.logprobs_complete
        batch = cls(input_ids, attn, cmask, adv, slp, valid)
        return batch.to(device) if device is not None else batch

    def to(self, device: Any) -> "Batch":
        def mv(x: Any) -> Any:
            return x.to(device) if x is not None else None

        return attrs.evolve(self, **{f.name: mv(getattr(self, f.name)) for f in attrs.fields(type(self))})

    def select(self, index: Any) -> "Batch":
        """Rows ``index`` (a slice or index tensor) of every tensor: mini-batches."""
        return attrs.evolve(
            self, **{f.name: (getattr(self, f.name)[index] if getattr(self, f.name) is not None else None)
                     for f in attrs.fields(type(self))}
        )
