"""Issue 35 items 10 and 11: the OpenEnv allow-list holds for every hop (a server at an allowed URL
that answers the ``/ws`` handshake with a redirect does not hand the episode to another server),
URLs that cannot be a server are refused up front in one line, and ``rlcore openenv serve --port
70000`` is one line."""

from __future__ import annotations

import http.server
import socket
import threading
from typing import Any, Iterator

import pytest
import rlcore
from rlcore.errors import ConfigError
from rlcore.rollout import run_rollouts
from rlcore.testing import ScriptedSampler
from rlcore.types import Prompt, SamplingParams

from rl_plugin_openenv.client import OpenEnvSession
from rl_plugin_openenv.server import DEFAULT_HOST


class CountingProxy:
    """A TCP listener on 127.0.0.1 that counts every connection it accepts and pipes it to
    ``target`` (a real OpenEnv server): an episode that reaches it would succeed, so following a
    redirect here is visible both as a count and as a trajectory that worked."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.accepted = 0
        self._sock = socket.create_server((DEFAULT_HOST, 0))
        self.port = self._sock.getsockname()[1]
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.accepted += 1
            upstream = socket.create_connection((DEFAULT_HOST, self.target_port))
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __enter__(self) -> "CountingProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop = True
        self._sock.close()


@pytest.fixture
def redirecting(server: str) -> Iterator[tuple[str, CountingProxy, list[str]]]:
    """(allowed URL, the server its /ws redirects to, the paths the allowed one was asked for)."""
    target_port = int(server.rsplit(":", 1)[1])
    with CountingProxy(target_port) as other:
        asked: list[str] = []

        class Redirect(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # what a WebSocket client accepts

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                asked.append(self.path)
                self.send_response(302)
                self.send_header("Location", f"ws://{DEFAULT_HOST}:{other.port}/ws")
                self.send_header("Content-Length", "0")
                self.send_header("Connection", "close")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        httpd = http.server.ThreadingHTTPServer((DEFAULT_HOST, 0), Redirect)
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://{DEFAULT_HOST}:{httpd.server_address[1]}", other, asked
        finally:
            httpd.shutdown()
            httpd.server_close()


async def test_a_redirect_from_an_allowed_server_is_not_followed(redirecting: Any, tokenizer: Any) -> None:
    """Was: the 302 was followed to the other port, which got the episode (and it succeeded there)."""
    allowed, other, asked = redirecting
    make = rlcore.get("scheduler", "openenv_scheduler")
    sched = make(ScriptedSampler(['{"guess": 3}'], tokenizer=tokenizer), tokenizer=tokenizer, env_url=allowed, max_turns=1)
    (t,) = (await run_rollouts(sched, [Prompt([], [], data={"env_config": {"target": 3}})],
                               sampling_params=SamplingParams(max_tokens=16), progress=False)).trajectories
    assert other.accepted == 0, "the redirect was followed to a server the run did not allow"
    assert t.status == "failed" and "\n" not in t.reason
    assert f"answered ws://{allowed[7:]}/ws with a redirect (302 to ws://{DEFAULT_HOST}:{other.port}/ws)" in t.reason, t.reason
    assert "redirects are not followed" in t.reason
    assert asked.count("/ws") == 1  # refused at once, not retried


async def test_the_client_alone_does_not_follow_redirects_either(redirecting: Any) -> None:
    allowed, other, _ = redirecting
    session = OpenEnvSession(allowed)
    with pytest.raises(rlcore.EnvError, match="with a redirect"):
        await session.reset()
    await session.close()
    assert other.accepted == 0


@pytest.mark.parametrize("url, needle", [
    ("file:///etc/passwd", "the scheme must be http, https, ws or wss, not file"),
    ("gopher://127.0.0.1:8000", "the scheme must be http, https, ws or wss, not gopher"),
    ("http://127.0.0.1:99999", "the port must be 1-65535, got 99999"),
    ("http://:8000", "names no host"),
])
def test_a_url_that_cannot_be_a_server_is_refused_up_front(url: str, needle: str, tokenizer: Any) -> None:
    """Was: 6 connection attempts over ~5 s per trajectory, or `ExceptionGroup: unhandled errors in a TaskGroup`."""
    make = rlcore.get("scheduler", "openenv_scheduler")
    for options, what in (({"env_url": url}, "env_url"),
                          ({"env_url": "http://127.0.0.1:8000", "allowed_env_urls": url}, "allowed_env_urls")):
        with pytest.raises(ConfigError) as exc:
            make(ScriptedSampler(["x"], tokenizer=tokenizer), tokenizer=tokenizer, **options)
        msg = str(exc.value)
        assert msg.startswith(f"{what} {url!r}") and needle in msg and "\n" not in msg, msg


async def test_a_row_url_that_cannot_be_a_server_fails_its_trajectory_at_once(tokenizer: Any) -> None:
    make = rlcore.get("scheduler", "openenv_scheduler")
    sched = make(ScriptedSampler(['{"guess": 3}'], tokenizer=tokenizer), tokenizer=tokenizer,
                 env_url="http://127.0.0.1:9", allow_any_env_url=True, max_turns=1)
    rows = [Prompt([], [], data={"env_config": {"base_url": u}}) for u in ("gopher://127.0.0.1:70", "http://127.0.0.1:99999")]
    trajs = (await run_rollouts(sched, rows, sampling_params=SamplingParams(max_tokens=16), progress=False)).trajectories
    assert [t.status for t in trajs] == ["failed", "failed"]
    assert "not gopher" in trajs[0].reason and "the port must be 1-65535, got 99999" in trajs[1].reason
    assert "ExceptionGroup" not in trajs[1].reason and "attempts" not in trajs[0].reason
    assert sched.stats.connect_retries == 0


def test_the_cli_refuses_a_bad_env_url_in_one_line(tmp_path: Any, capsys: Any) -> None:
    from rlcore.commands.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["rollout", "--scheduler", "openenv_scheduler", "--env-url", "gopher://127.0.0.1:8000", "--limit", "1",
              "--no-progress", "-o", str(tmp_path / "r.jsonl")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("Error: env_url 'gopher://127.0.0.1:8000' is not an OpenEnv server URL") and "\n" not in err, err


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_serve_with_a_port_out_of_range_is_one_line(port: str, capsys: Any) -> None:
    """Was: an 87-line OverflowError traceback from the socket bind (70000)."""
    from rlcore.commands.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["openenv", "serve", "--port", port])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"Error: --port must be a TCP port from 1 to 65535, got {port}", err
