"""Import OpenEnv's server package without its optional gradio web UI.

``openenv.core.env_server`` imports its web UI (gradio: ~10 s of imports) inside ``try/except
ModuleNotFoundError``, and ``create_app`` only uses it when ``ENABLE_WEB_INTERFACE`` is set. Our
servers start (and the tests run) seconds faster when that import is skipped; with the variable
set, nothing is blocked.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import os
import sys
from typing import Any, Iterator


class BlockGradio(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname == "gradio" or fullname.startswith("gradio."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (skipped: web UI disabled)", name=fullname)
        return None


@contextlib.contextmanager
def without_gradio() -> Iterator[None]:
    """Import OpenEnv's server without its optional gradio web UI (~10 s of imports, unused here).

    ``openenv.core.env_server`` imports the web UI inside ``try/except ModuleNotFoundError``, and
    ``create_app`` only needs it when ``ENABLE_WEB_INTERFACE`` is set; then nothing is blocked.
    """
    if "openenv.core.env_server" in sys.modules or "gradio" in sys.modules or \
            os.getenv("ENABLE_WEB_INTERFACE", "false").lower() in ("true", "1", "yes"):
        yield
        return
    blocker = BlockGradio()
    sys.meta_path.insert(0, blocker)
    try:
        yield
    finally:
        sys.meta_path.remove(blocker)
