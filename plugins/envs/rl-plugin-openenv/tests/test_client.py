"""The WebSocket session client against real OpenEnv servers (uvicorn on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import time

import pytest
from rlcore.errors import EnvError

from rl_plugin_openenv.client import ActionRejected, ClientOptions, ClientStats, OpenEnvSession
from rl_plugin_openenv.limiter import SessionLimiter, server_capacity
from rl_plugin_openenv.server import ServerThread, active_sessions, sessions_settle

from rl_plugin_openenv.testing import ServerProcess


#: the ``server`` fixture (conftest) serves two sessions here, so the cap is easy to reach
SERVER_OPTIONS = {"max_concurrent_envs": 2}


@pytest.fixture(scope="module")
def slow_server():
    with ServerThread(max_concurrent_envs=4, step_delay=0.6) as url:
        yield url




async def test_episode_reset_step_state_close(server):
    session = OpenEnvSession(server)
    first = await session.reset(seed=3, target=30, max_attempts=4)
    assert first.observation["attempts_left"] == 4 and not first.done
    low = await session.step({"guess": 10})
    assert "too low" in low.observation["text"] and low.reward == 0.0 and not low.done
    win = await session.step({"message": "then 30"})
    assert win.reward == 1.0 and win.done
    assert (await session.state())["step_count"] == 2
    assert await sessions_settle(server, 1) == 1
    await session.close()
    await session.close()  # idempotent
    assert await sessions_settle(server, 0) == 0
    assert session.stats.sessions_opened == session.stats.sessions_closed == 1


async def test_validation_error_keeps_session(server):
    async with OpenEnvSession(server) as session:
        await session.reset(target=5)
        with pytest.raises(ActionRejected, match="VALIDATION_ERROR.*guess"):
            await session.step({"guess": "five"})
        assert (await session.step({"guess": 5})).done  # same session, same episode
        assert session.stats.rejected_actions == 1


async def test_capacity_reached_retries_then_fails_with_reason(server):
    holders = [OpenEnvSession(server) for _ in range(2)]
    for h in holders:
        await h.reset()
    late = OpenEnvSession(server, ClientOptions(max_retries=2, backoff=0.02))
    with pytest.raises(EnvError, match="could not open a session after 3 attempts.*CAPACITY_REACHED"):
        await late.reset()
    assert late.stats.capacity_retries == 3 and not late.is_open
    # a slot frees up while a waiter backs off: it gets in
    waiter = OpenEnvSession(server, ClientOptions(max_retries=20, backoff=0.05, max_backoff=0.1))
    task = asyncio.create_task(waiter.reset(target=1))
    await asyncio.sleep(0.15)
    await holders[0].close()
    assert (await task).observation["attempts_left"] == 8
    assert waiter.stats.capacity_retries >= 1
    for s in (holders[1], waiter):
        await s.close()
    assert await sessions_settle(server, 0) == 0


async def test_limiter_queues_instead_of_tripping_capacity(server):
    cap = await server_capacity(server)
    assert cap == 2
    limiter, stats = SessionLimiter(cap), ClientStats()

    async def episode(i: int) -> float:
        async with OpenEnvSession(server, limiter=limiter, stats=stats) as s:
            await s.reset(target=i)
            return (await s.step({"guess": i})).reward or 0.0

    rewards = await asyncio.gather(*(episode(i) for i in range(1, 9)))
    assert rewards == [1.0] * 8
    assert stats.capacity_retries == 0 and stats.sessions_opened == 8
    assert limiter.in_use == 0


async def test_limiter_learns_server_limit_from_capacity_error(server):
    limiter, stats = SessionLimiter(16), ClientStats()  # we guessed too high: the server says 2

    async def episode(i: int) -> bool:
        async with OpenEnvSession(server, ClientOptions(backoff=0.02), limiter=limiter, stats=stats) as s:
            await s.reset(target=i)
            await asyncio.sleep(0.05)
            return (await s.step({"guess": i})).done

    assert all(await asyncio.gather(*(episode(i) for i in range(1, 7))))
    assert limiter.limit == 2 and stats.capacity_retries >= 1


async def test_timeout_drops_socket_and_next_call_is_not_desynchronised(slow_server):
    session = OpenEnvSession(slow_server, ClientOptions(call_timeout=0.15))
    await session.reset(target=7, max_attempts=3)
    with pytest.raises(EnvError, match="no reply within 0.15s; the session was dropped"):
        await session.step({"guess": 1})
    assert not session.is_open and session.stats.timeouts == 1
    with pytest.raises(EnvError, match="not open"):
        await session.step({"guess": 2})
    await asyncio.sleep(0.6)  # the late step reply is sent now, to a socket nobody reads
    fresh = await session.reset(target=7, max_attempts=3)
    assert fresh.observation["attempts_left"] == 3 and fresh.reward == 0.0  # a reset reply, not the late step's
    await session.close()
    assert await sessions_settle(slow_server, 0) == 0


async def test_cancelled_call_drops_the_socket(slow_server):
    session = OpenEnvSession(slow_server)
    await session.reset(target=7)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(session.step({"guess": 1}), 0.1)
    assert not session.is_open
    await session.close()
    assert await sessions_settle(slow_server, 0) == 0


async def test_server_killed_mid_step_then_restarted():
    proc = ServerProcess(step_delay=0.5).start()
    try:
        session = OpenEnvSession(proc.url, ClientOptions(max_retries=1, backoff=0.05))
        await session.reset(target=3)
        step = asyncio.create_task(session.step({"guess": 3}))
        await asyncio.sleep(0.2)
        proc.kill()
        with pytest.raises(EnvError, match="during step"):
            await step
        with pytest.raises(EnvError, match="could not open a session after 2 attempts.*cannot connect"):
            await session.reset()
        await session.close()
        # restart on the same port: a session whose retries span the restart succeeds
        waiter = OpenEnvSession(proc.url, ClientOptions(max_retries=60, backoff=0.1, max_backoff=0.5))
        task = asyncio.create_task(waiter.reset(target=4))
        await asyncio.sleep(0.3)
        proc.start()
        assert (await task).observation["attempts_left"] == 8
        assert (await waiter.step({"guess": 4})).reward == 1.0
        assert waiter.stats.connect_retries >= 1
        await waiter.close()
    finally:
        proc.kill()


async def test_unreachable_server_fails_with_one_line():
    from rl_plugin_openenv.server import free_port

    session = OpenEnvSession(f"http://127.0.0.1:{free_port()}", ClientOptions(max_retries=1, backoff=0.01))
    with pytest.raises(EnvError) as info:
        await session.reset()
    assert "\n" not in str(info.value) and "check the server is up" in str(info.value)


async def test_close_finishes_even_when_the_caller_is_cancelled(server):
    session = OpenEnvSession(server)
    await session.reset()
    closing = asyncio.create_task(session.close())
    await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert not session.is_open
    assert await sessions_settle(server, 0) == 0  # the shielded close still ended the server session


async def test_steps_of_many_sessions_overlap_and_sessions_share_one_server_worker():
    """The server awaits each session's slow step (never a blocking sleep), so 16 steps of 0.3 s
    take ~0.3 s, not 16 x; and opening 16 sessions does not start 16 server threads."""
    import threading

    with ServerThread(max_concurrent_envs=16, step_delay=0.3) as url:
        sessions = [OpenEnvSession(url) for _ in range(16)]
        before = threading.active_count()
        await asyncio.gather(*(s.reset(target=50) for s in sessions))
        assert threading.active_count() - before <= 2  # one shared construction worker, not one per session
        t0 = time.perf_counter()
        replies = await asyncio.gather(*(s.step({"guess": 10}) for s in sessions))
        wall = time.perf_counter() - t0
        await asyncio.gather(*(s.close() for s in sessions))
        assert all("too low" in r.observation["text"] for r in replies)
        assert 0.3 <= wall < 1.5, f"16 concurrent 0.3 s steps took {wall:.2f}s: the server serialised them"
        assert await sessions_settle(url, 0) == 0
