"""``python -m rlcore``: the ``rlcore`` command (:mod:`rlcore.commands.cli`), for an environment
whose scripts folder is not on ``PATH``."""

from __future__ import annotations

from .commands.cli import main

if __name__ == "__main__":
    main()
