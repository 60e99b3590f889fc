"""The async driver: every trajectory is its own asyncio task, many in flight.

Why per-trajectory tasks and not a turn-synchronous loop: with environments in the loop, a
turn-synchronous batch waits for its slowest env step before anyone generates again. Here a
trajectory whose env is slow just awaits it while the others keep the sampler busy (the ``hf``
sampler gathers whatever requests are pending into one batch). Failures stay local: a trajectory
whose env or hook raises, or that times out, ends ``failed`` with a reason, the rest complete.
"""

from __future__ import annotations

import asyncio
import collections
import time
import uuid as uuidlib
import weakref
from typing import Any, Callable, Iterable

import attrs

from ..asyncutil import await_me_maybe
from ..errors import one_line as _one_line
from ..plugins import RunHooks
from ..types import Prompt, SamplingParams, Trajectory
from .assemble import RolloutOutput, output_to_trajectory
from .invariants import check_trajectory, fail_violations
from .progress import RolloutProgress
from .scheduler import SAMPLES, STARTED, RolloutScheduler, accepts_request_config, scheduler_label
from .token_backed import materialize_messages


@attrs.define
class RolloutResult:
    """The finished trajectories (``num_generations`` per prompt, grouped in order) and counts."""

    trajectories: list[Trajectory]
    stats: dict[str, Any]


def make_trajectories(prompts: Iterable[Prompt], num_generations: int = 1) -> list[Trajectory]:
    """``num_generations`` fresh trajectories per prompt, sharing the prompt's ``group_id``."""
    out = []
    for p in prompts:
        for _ in range(num_generations):
            out.append(
                Trajectory(
                    prompt_ids=list(p.prompt_ids),
                    messages=[dict(m) for m in p.messages],
                    data=dict(p.data),
                    group_id=p.group_id,
                    infos={"prompt_truncated": p.truncated_tokens} if getattr(p, "truncated_tokens", 0) else {},
                )
            )
    return out


async def run_rollouts(
    scheduler: RolloutScheduler,
    prompts: list[Prompt],
    *,
    num_generations: int = 1,
    sampling_params: SamplingParams | None = None,
    components: Iterable[Any] = (),
    observers: Iterable[str] = (),
    concurrency: int = 64,
    progress: bool = True,
    timeout: float | None = None,
    trajectories: list[Trajectory] | None = None,
    check: bool = True,
    on_finished: Callable[[list[Trajectory]], Any] | None = None,
) -> RolloutResult:
    """Roll out ``num_generations`` trajectories per prompt with ``scheduler``.

    ``components`` are observer objects and ``observers`` names of installed observer plugins
    active for this run: they see ``on_trajectory_start`` and every ``on_turn_end`` and may add
    infos, never end trajectories or change rewards. ``timeout`` bounds each trajectory's ``run``
    in seconds. Pass ``trajectories`` instead of prompts to roll out prepared trajectories.
    ``check`` holds every trajectory to the invariants (:mod:`rlcore.rollout.invariants`); a
    violation fails that trajectory with a reason naming the scheduler and the turn.

    ``on_finished`` streams the run: it is called (and awaited when it returns an awaitable) with
    each trajectory's finished trajectories (several when its ``run`` returns several) as soon as they end, and the driver keeps none of them —
    the result's ``trajectories`` is empty, its ``stats`` count them all, so memory stays flat
    however many trajectories a run has. An exception it raises stops the run: the trajectories
    still running are cancelled (their ``on_trajectory_end`` runs) and the exception propagates.
    """
    if getattr(scheduler, "sampling_params", None) is None and sampling_params is not None:
        scheduler.sampling_params = sampling_params
    if getattr(scheduler, "tokenizer", None) is None and getattr(scheduler, "sampler", None) is not None:
        scheduler.tokenizer = getattr(scheduler.sampler, "tokenizer", None)
    hooks = RunHooks(observers=list(observers), observer_objects=list(components))
    scheduler.observers = hooks
    trajs = trajectories if trajectories is not None else make_trajectories(prompts, num_generations)
    started = time.perf_counter()
    bar = RolloutProgress(len(trajs), enabled=progress)
    stream = on_finished is not None
    results: list[list[Trajectory]] = [] if stream else [[] for _ in trajs]
    tally, seen = _Tally(), {}  # streaming: counts and uuids only, never the finished trajectories
    who = scheduler_label(scheduler)
    # once a run, not once a trajectory (inspect is slow); a scheduler without run still fails each
    # trajectory with the reason, where _run_one reads scheduler.run
    with_params = accepts_request_config(getattr(scheduler, "run", None))
    with bar:
        try:
            await await_me_maybe(scheduler.on_trajectory_start(trajs))
            await hooks.call_observers("on_trajectory_start", trajectories=trajs)
        except Exception as exc:  # noqa: BLE001 - a batch-level hook failing fails the batch's trajectories
            for t in trajs:
                if t.status == "running":
                    t.fail(f"{who} on_trajectory_start raised {_one_line(exc)}")
        sem = asyncio.Semaphore(max(1, int(concurrency)))

        async def one(i: int, trajectory: Trajectory) -> None:
            async with sem:
                done = await _run_one(scheduler, trajectory, timeout, check, with_params)
            bar.advance(done)
            if not stream:
                results[i] = done
                return
            done = _unique_streamed(done, seen)
            tally.add(done)
            await await_me_maybe(on_finished(done))  # type: ignore[misc]

        tasks = [asyncio.ensure_future(one(i, t)) for i, t in enumerate(trajs)]
        if stream:  # each task holds its own trajectory until it is handed on, then nobody here does
            del trajs, trajectories
        try:
            await asyncio.gather(*tasks)
        except BaseException:  # on_finished raised, or the run was cancelled: end the rest cleanly
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
    if stream:
        return RolloutResult([], tally.stats(time.perf_counter() - started))
    flat = [t for group in results for t in group]
    flat = _unique_uuids(flat)
    stats = summarize(flat, time.perf_counter() - started)
    return RolloutResult(flat, stats)


async def _run_one(scheduler: RolloutScheduler, trajectory: Trajectory, timeout: float | None, check: bool = True,
                   with_params: bool = True) -> list[Trajectory]:
    """Run one trajectory; every exception becomes ``failed`` + reason; cleanup on every path.
    ``with_params``: ``scheduler.run`` takes the sampling params after the trajectory (ms-swift's
    ``request_config``; :func:`accepts_request_config`, asked once for the whole run)."""
    out: Any = trajectory
    samples: list[Any] = []
    SAMPLES.set(samples)
    STARTED.set(frozenset({trajectory.uuid}))  # the driver ran on_trajectory_start for the batch
    who = scheduler_label(scheduler)
    try:
        if trajectory.status == "running":  # on_trajectory_start may have failed it already
            run = scheduler.run
            if with_params:
                coro = run(trajectory, getattr(scheduler, "sampling_params", None))
            else:  # an override without sampling params: run(self, trajectory)
                coro = run(trajectory)
            out = await (asyncio.wait_for(coro, timeout) if timeout else coro)
    except asyncio.TimeoutError:
        trajectory.fail(f"timed out after {timeout:g}s")
        out = trajectory
    except asyncio.CancelledError:
        trajectory.fail("cancelled")
        raise
    except Exception as exc:  # noqa: BLE001 - one bad trajectory never takes the batch down
        n = trajectory.num_turns or len(samples)  # a run override's recorded samples (it counts no turns)
        turn = f" turn {n}" if n else ""
        trajectory.fail(f"{who}{turn}: {_one_line(exc)}")
        out = trajectory
    finally:
        try:
            await await_me_maybe(scheduler.on_trajectory_end(trajectory))
        except Exception as exc:  # noqa: BLE001
            trajectory.infos["close_error"] = _one_line(exc)
        release = getattr(scheduler, "release", None)
        if release is not None:
            release(trajectory)
    try:
        trajs = normalize_run_output(trajectory, out, samples, scheduler)
    except Exception as exc:  # noqa: BLE001 - a bad output fails its trajectory, never the batch
        trajectory.fail(f"{who} returned an output rlcore cannot train on: {_one_line(exc)}")
        trajs = [trajectory]
    for t in trajs:
        try:  # token-backed assistant messages become their text
            materialize_messages(getattr(scheduler, "tokenizer", None), t.messages)
        except Exception as exc:  # noqa: BLE001
            t.fail(f"{who}: {_one_line(exc)}")
        finalize(t)
        if check and t.status != "failed":
            tok = getattr(scheduler, "tokenizer", None)
            if tok is not None:
                fail_violations([t], check_trajectory(t, tok, tools=template_tools(scheduler)), who)
    return trajs


def normalize_run_output(trajectory: Trajectory, out: Any, samples: list[Any] | None = None, scheduler: Any = None) -> list[Trajectory]:
    """Accept what an (overridden) ``run`` of ``trajectory`` returns: a trajectory, several, or
    :class:`~rlcore.rollout.assemble.RolloutOutput` reports.

    RolloutOutputs are assembled token-exactly (:mod:`rlcore.rollout.assemble`); every output after
    the first gets its own uuid (``infos["request_uuid"]`` names the trajectory that was run)."""
    if out is None:
        return [trajectory]
    items = out if isinstance(out, (list, tuple)) else [out]
    trajs: list[Trajectory] = []
    for item in items:
        if isinstance(item, Trajectory):
            trajs.append(item)
        elif isinstance(item, RolloutOutput):
            tok = getattr(scheduler, "tokenizer", None)
            try:
                trajs.append(output_to_trajectory(trajectory, item, samples or [], tok, tools=template_tools(scheduler)))
            except Exception as exc:  # noqa: BLE001 - one bad output of several fails only its own trajectory
                if len(items) == 1 or not all(isinstance(i, RolloutOutput) for i in items):
                    raise
                bad = attrs.evolve(trajectory, turns=[], infos=dict(trajectory.infos), messages=list(trajectory.messages))
                bad.fail(f"{scheduler_label(scheduler)} returned an output rlcore cannot train on: {_one_line(exc)}")
                trajs.append(bad)
        else:
            raise TypeError(f"run returned {type(item).__name__}; return a Trajectory, a list of them, or RolloutOutput")
    seen: set[str] = set()
    for t in trajs:
        t.group_id = t.group_id or trajectory.group_id
        if t.uuid in seen:
            t.infos["request_uuid"] = trajectory.uuid
            t.uuid = uuidlib.uuid4().hex
        seen.add(t.uuid)
    return trajs or [trajectory]


def template_tools(scheduler: Any) -> list[dict[str, Any]] | None:
    """The tool schemas a scheduler renders into prompts (also for duck-typed schedulers)."""
    tools = getattr(scheduler, "template_tools", None)
    if tools is None:
        tools = getattr(scheduler, "tools", None)
    return tools if isinstance(tools, list) and all(isinstance(t, dict) for t in tools) and tools else None


def _unique_uuids(trajs: list[Trajectory]) -> list[Trajectory]:
    """The same trajectory object returned twice counts once; two trajectories sharing a uuid
    (a scheduler that copies uuids) fail loudly instead of training as one."""
    seen: dict[str, Trajectory] = {}
    out = []
    for t in trajs:
        prev = seen.get(t.uuid)
        if prev is t:
            continue
        if prev is not None:
            t.fail(f"uuid {t.uuid} is already used by another trajectory of this batch")
        else:
            seen[t.uuid] = t
        out.append(t)
    return out


def _unique_streamed(trajs: list[Trajectory], seen: dict[str, Any]) -> list[Trajectory]:
    """:func:`_unique_uuids` across a streamed run: ``seen`` maps uuids to weak references, so the
    trajectories already handed on are not kept alive by the check."""
    out = []
    for t in trajs:
        prev = seen.get(t.uuid)
        if prev is not None and prev() is t:
            continue
        if prev is not None:  # a live other object, or a dead one (then certainly not ``t``)
            t.fail(f"uuid {t.uuid} is already used by another trajectory of this batch")
        else:
            seen[t.uuid] = weakref.ref(t)
        out.append(t)
    return out


def finalize(t: Trajectory) -> None:
    """Final bookkeeping: status, turn count, the logprob completeness flag (IS correction gate)."""
    if t.status == "running":
        t.status = "ok"
    if not t.num_turns:
        t.num_turns = sum(1 for turn in t.turns if turn.role == "assistant")
    t.infos["num_turns"] = t.num_turns  # ms-swift's rollout_infos key; always the final count
    step_rewards = t.infos.get("step_rewards")  # ms-swift's rollout_infos key (its GYMScheduler's on_turn_end)
    if not t.step_rewards and isinstance(step_rewards, list) and step_rewards and all(
            isinstance(r, (int, float)) and not isinstance(r, bool) for r in step_rewards):
        t.step_rewards = [float(r) for r in step_rewards]
    t.infos["logprobs_complete"] = t.logprobs_complete
    t.infos.setdefault("prompt_messages", _prompt_messages(t))


def _prompt_messages(t: Trajectory) -> int:
    for i, m in enumerate(t.messages):
        if m.get("role") == "assistant":
            return i
    return len(t.messages)


def summarize(trajs: list[Trajectory], wall_s: float) -> dict[str, Any]:
    """Counts for logs and metrics: ok / truncated / failed, turns, tokens, top failure reasons."""
    tally = _Tally()
    tally.add(trajs)
    return tally.stats(wall_s)


class _Tally:
    """The counters :func:`summarize` reports, added to as trajectories finish (a streamed run)."""

    def __init__(self) -> None:
        self.by_status: collections.Counter[str] = collections.Counter()
        self.reasons: collections.Counter[str | None] = collections.Counter()
        self.n = self.turns = self.completion_tokens = self.logprobs_incomplete = 0

    def add(self, trajs: Iterable[Trajectory]) -> None:
        for t in trajs:
            self.n += 1
            self.by_status[t.status] += 1
            if t.status == "failed":
                self.reasons[t.reason] += 1
            self.turns += t.num_turns
            self.completion_tokens += t.num_completion_tokens
            self.logprobs_incomplete += not t.logprobs_complete

    def stats(self, wall_s: float) -> dict[str, Any]:
        n = self.n
        return {
            "trajectories": n,
            "ok": self.by_status.get("ok", 0),
            "truncated": self.by_status.get("truncated", 0),
            "failed": self.by_status.get("failed", 0),
            "turns": self.turns,
            "mean_turns": self.turns / n if n else 0.0,
            "completion_tokens": self.completion_tokens,
            "logprobs_incomplete": self.logprobs_incomplete,
            "failure_reasons": dict(self.reasons.most_common(5)),
            "wall_s": wall_s,
        }
