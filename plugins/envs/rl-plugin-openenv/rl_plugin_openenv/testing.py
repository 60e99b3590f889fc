"""Test and benchmark helpers: real OpenEnv servers in a subprocess (so they can be killed).

``rl_plugin_openenv.server.ServerThread`` is the in-process variant.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from rl_plugin_openenv.server import free_port, wait_until_up


class ServerProcess:
    """``python -m rl_plugin_openenv openenv serve …`` on 127.0.0.1; ``kill()`` is a hard SIGKILL."""

    def __init__(self, port: int | None = None, **options: Any) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.options = options
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "ServerProcess":
        args = [sys.executable, "-m", "rl_plugin_openenv", "openenv", "serve", "guess_number", "--port", str(self.port)]
        for k, v in self.options.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        self._log = tempfile.TemporaryFile()  # a file, not a pipe: a chatty server never blocks on it
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=dict(os.environ))
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"OpenEnv server exited with code {self.proc.returncode}: {self.log_tail()}")
            try:
                wait_until_up(self.url, timeout=0.5)
                return self
            except TimeoutError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise

    def log_tail(self, n: int = 400) -> str:
        """The end of the server's output (for error messages)."""
        if getattr(self, "_log", None) is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-n:].strip()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.kill()
