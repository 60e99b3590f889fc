"""Server-side session hygiene: a client that vanishes, or goes quiet, gives its slot back.

Two faults held an OpenEnv session slot forever when the server ran with ``ws_ping_interval=None``:
a client whose machine or network died (no close frame ever arrives: TCP alone notices nothing for
hours), and a client that is connected but never sends again (a hung trainer). The first is what
WebSocket pings are for (uvicorn closes a connection whose pong does not come within
``ping_timeout``); the second needs an idle limit, which :class:`IdleReaper` adds in front of
OpenEnv's app: when no message has arrived for ``idle_timeout`` seconds it tells the app the client
disconnected, so OpenEnv's own handler destroys the session and closes the socket.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

#: Defaults for this package's servers: ping every 20 s, drop a client silent to pings for 20 s, and
#: reap a session that sent nothing for 10 minutes (longer than any sane generation between steps).
PING_INTERVAL = 20.0
PING_TIMEOUT = 20.0
IDLE_TIMEOUT = 600.0


class IdleReaper:
    """ASGI middleware: a WebSocket that receives nothing for ``idle_timeout`` seconds is ended.

    ``reaped`` counts the sessions ended this way (the ``/capacity`` route reports it)."""

    def __init__(self, app: Any, idle_timeout: float | None = IDLE_TIMEOUT) -> None:
        self.app = app
        self.idle_timeout = idle_timeout
        self.reaped = 0

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                       send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] != "websocket" or not self.idle_timeout:
            await self.app(scope, receive, send)
            return
        limit = float(self.idle_timeout)
        gone = False

        async def bounded_receive() -> dict[str, Any]:
            nonlocal gone
            if gone:
                return {"type": "websocket.disconnect", "code": 1001}
            try:
                return await asyncio.wait_for(receive(), limit)
            except asyncio.TimeoutError:
                gone = True
                self.reaped += 1
                try:  # tell the client why, then let the app clean up as for any disconnect
                    await send({"type": "websocket.close", "code": 1001, "reason": f"idle for {limit:g}s"})
                except Exception:  # noqa: BLE001 - the socket may already be half gone
                    pass
                return {"type": "websocket.disconnect", "code": 1001}

        async def guarded_send(message: dict[str, Any]) -> None:
            if gone and message.get("type") == "websocket.close":
                return  # already closed above
            if gone:
                raise RuntimeError("the session was reaped for idleness")
            await send(message)

        await self.app(scope, bounded_receive, guarded_send)
