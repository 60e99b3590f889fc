"""Network hygiene (issue 14, point 13): responses are size-capped, a vanished or silent client
gives its session slot back, and a dataset row can only point at a server the run allows."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import time
from typing import Any, Iterator

import httpx
import pytest
import rlcore
from rlcore.errors import EnvError
from rlcore.rollout import run_rollouts
from rlcore.testing import ScriptedSampler
from rlcore.testing.fuzz import flooding_http_server
from rlcore.types import Prompt, SamplingParams

from rl_plugin_openenv.client import OpenEnvSession
from rl_plugin_openenv.limiter import MAX_CAPACITY_BYTES, server_capacity
from rl_plugin_openenv.server import ServerThread
from rl_plugin_openenv.tools import discover_tools


def capacity(url: str) -> dict[str, int]:
    return httpx.get(url + "/capacity", timeout=5).json()


def wait_for(predicate: Any, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_a_silent_client_is_reaped_and_its_slot_reused() -> None:
    """Before: a connected client that never sent again held the only slot forever."""
    with ServerThread(max_concurrent_envs=1, idle_timeout=0.5) as url:
        from websockets.sync.client import connect

        with connect(url.replace("http", "ws") + "/ws", open_timeout=5):  # opens a session, then says nothing
            assert wait_for(lambda: capacity(url)["reaped_sessions"] == 1)

            async def play() -> Any:
                session = OpenEnvSession(url)
                try:
                    return await session.reset()
                finally:
                    await session.close()

            assert asyncio.run(play()) is not None  # the slot is free again


def _raw_websocket(url: str) -> socket.socket:
    """A client that does the WebSocket handshake and then vanishes: never reads, never pongs."""
    host, port = url.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    assert b"101" in sock.recv(4096).split(b"\r\n")[0]
    return sock


def test_a_vanished_client_is_dropped_by_keepalive_pings() -> None:
    """Before (ws_ping_interval=None): a client whose machine died held its slot until TCP noticed (hours)."""
    with ServerThread(max_concurrent_envs=2, idle_timeout=None, ping_interval=0.2, ping_timeout=0.2) as url:
        sock = _raw_websocket(url)
        try:
            assert wait_for(lambda: capacity(url)["active_sessions"] == 1, 10)
            assert wait_for(lambda: capacity(url)["active_sessions"] == 0)
            assert capacity(url)["reaped_sessions"] == 0  # pings did it, not the idle reaper
        finally:
            sock.close()


@pytest.fixture
def huge_server() -> Iterator[str]:
    """Every GET answers a JSON start, then 64 MiB that never closes the string."""
    with flooding_http_server(b'{"max_sessions": 4, "action": {}, "pad": "', method="GET", megabytes=64) as url:
        yield url


async def test_capacity_and_schema_bodies_are_size_capped(huge_server: str) -> None:
    """Before: /capacity and /schema were read whole (64 MiB here, unbounded in general)."""
    assert MAX_CAPACITY_BYTES < (1 << 20)
    assert await server_capacity(huge_server) is None  # unknown, not an out-of-memory
    with pytest.raises(EnvError, match="more than 4194304 bytes"):
        await discover_tools(huge_server)


async def test_a_row_cannot_point_the_run_at_an_unconfigured_server(server: str, tokenizer: Any) -> None:
    evil = "http://10.255.255.1:80"
    prompts = [Prompt([], [], data={"env_config": {"base_url": evil}}), Prompt([], [], data={"env_config": {"target": 3}})]
    make = rlcore.get("scheduler", "openenv_scheduler")
    sched = make(ScriptedSampler(['{"guess": 3}'] * 2, tokenizer=tokenizer), tokenizer=tokenizer, env_url=server, max_turns=1)
    bad, good = (await run_rollouts(sched, prompts, sampling_params=SamplingParams(max_tokens=16), progress=False)).trajectories
    assert bad.status == "failed" and "is not an allowed OpenEnv server" in bad.reason and "--allow-any-env-url" in bad.reason
    assert good.status != "failed"
    trusting = make(ScriptedSampler(['{"guess": 3}'], tokenizer=tokenizer), tokenizer=tokenizer, env_url="http://127.0.0.1:9",
                    max_turns=1, allow_any_env_url=True)
    (t,) = (await run_rollouts(trusting, [Prompt([], [], data={"env_config": {"base_url": server, "target": 3}})],
                               sampling_params=SamplingParams(max_tokens=16), progress=False)).trajectories
    assert t.status != "failed"
