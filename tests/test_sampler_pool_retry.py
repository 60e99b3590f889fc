"""The sampler pool's retry rule, with worker deaths injected: a trajectory whose worker dies moves
to another live worker once; a second death under it ends it with the reason even while a live
worker remains (it does not hop across a failing cluster), and other trajectories keep going."""

from __future__ import annotations

import asyncio

import pytest

ray = pytest.importorskip("ray")

from rlcore.distributed import WorkerFailedError  # noqa: E402
from rlcore.distributed.pool import RemoteSampler  # noqa: E402
from rlcore.distributed.routing import bind_trajectory  # noqa: E402
from rlcore.types import Completion, SamplingParams  # noqa: E402


class _Method:
    def __init__(self, fn):
        self.remote = fn


class DyingWorker:
    """A sampler actor handle whose ``generate`` answers, or — once ``dead`` — fails as a dead actor."""

    def __init__(self, rank: int) -> None:
        self.rank, self.dead, self.served = rank, False, 0
        self.generate = _Method(self._generate)

    def _generate(self, prompt_ids, params):
        async def run():
            await asyncio.sleep(0)
            if self.dead:
                raise ray.exceptions.ActorDiedError()
            self.served += 1
            return Completion(token_ids=[1], text="x", logprobs=[0.0], finish_reason="stop",
                              meta={"sampler_worker": self.rank})
        return asyncio.ensure_future(run())


async def test_a_trajectory_is_retried_once_then_fails_with_the_reason():
    workers = [DyingWorker(i) for i in range(3)]
    pool = RemoteSampler(workers, timeout_s=10)
    params = SamplingParams(max_tokens=1)
    with bind_trajectory("a"):  # first turn on worker 0 (least loaded, lowest index)
        assert (await pool.generate([1], params)).meta["sampler_worker"] == 0
    with bind_trajectory("b"):
        assert (await pool.generate([1], params)).meta["sampler_worker"] == 1
    workers[0].dead = True
    with bind_trajectory("a"):  # worker 0 died under a: moved once, to the least-loaded live one
        assert (await pool.generate([1], params)).meta["sampler_worker"] == 2
    assert pool.retries == 1 and pool.alive_workers == [1, 2]
    workers[2].dead = True
    with bind_trajectory("a"), pytest.raises(WorkerFailedError, match=r"sampler workers 0, 2 died under this "
                                                                      r"trajectory .*retried once"):
        await pool.generate([1], params)
    assert pool.alive_workers == [1]  # worker 1 lives; a was not sent there a second time
    with bind_trajectory("b"):  # b never lost a worker: it goes on
        assert (await pool.generate([1], params)).meta["sampler_worker"] == 1
    with bind_trajectory("c"):  # a new trajectory after deaths: a live worker, no retry counted
        assert (await pool.generate([1], params)).meta["sampler_worker"] == 1
    assert pool.retries == 2
