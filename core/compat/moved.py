"""Old import paths of modules that moved (issue #30's restructuring), kept working.

``import rlcore.train_cli`` or ``from rlcore.rollout.swift4 import SwiftHelpers`` still works:
a finder at the end of ``sys.meta_path`` answers only for the names below, imports the module where
it lives now and hands back that very module object (so classes, ``isinstance`` and monkeypatching
are the same whichever path was used), with a :class:`DeprecationWarning` naming the new path.
Real modules always win: the finder is asked only after the normal finders found nothing.

Names that left a module which stays (``from rlcore.rollout import remove_response``: ms-swift's
helpers now live in :mod:`rlcore.compat.swift`) work the same way through :data:`MOVED_NAMES`: the
package root calls :func:`install_names` once its modules are imported, which gives each such module
a ``__getattr__`` answering only for its moved names (so the module itself imports nothing of where
they went).

An old name that is a real module again (``rlcore.sampling.hf``, now the package that holds the
sampler and still gives ``HFSampler``) has no entry here: the finder would never be asked.
``python -m rlcore.cli`` runs the command where it lives now (``python -m rlcore.commands.cli``, or
``python -m rlcore``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType
from typing import Any, Sequence

#: old module name -> where the module lives now
MOVED: dict[str, str] = {
    "rlcore.algorithms.plugin": "rlcore.builtin_components",
    "rlcore.bounded_worker": "rlcore.bounded.child",
    "rlcore.cli": "rlcore.commands.cli",
    "rlcore.demo": "rlcore.data.demo",
    "rlcore.distributed.cli": "rlcore.commands.distributed",
    "rlcore.distributed.config": "rlcore.distributed.layout",
    "rlcore.distributed.errors": "rlcore.distributed.failures",
    "rlcore.distributed.loop": "rlcore.distributed.groups",
    "rlcore.distributed.placement": "rlcore.distributed.placement_groups",
    "rlcore.docgen": "rlcore.commands.docgen",
    "rlcore.loop.placement": "rlcore.loop.placer",
    "rlcore.loop.rewards": "rlcore.loop.scoring",
    "rlcore.loop.rollout": "rlcore.loop.rollouts",
    "rlcore.rollout.cli": "rlcore.commands.rollout",
    "rlcore.rollout.plugin": "rlcore.builtin_components",
    "rlcore.rollout.swift4": "rlcore.compat.swift.v4",
    "rlcore.rollout.swift_api": "rlcore.compat.swift.api",
    "rlcore.rollout.tokens": "rlcore.chat_template",
    "rlcore.sampling.hf_decode": "rlcore.sampling.hf.decode",
    "rlcore.sampling.hf_fused": "rlcore.sampling.hf.fused",
    "rlcore.sampling.hf_static": "rlcore.sampling.hf.static",
    "rlcore.sampling.plugin": "rlcore.builtin_components",
    "rlcore.sampling.vllm_support": "rlcore.sampling.vllm.support",
    "rlcore.sampling.vllm_worker": "rlcore.sampling.vllm.worker",
    "rlcore.scaffold": "rlcore.commands.scaffold",
    "rlcore.tasks": "rlcore.data.tasks",
    "rlcore.testing.cli": "rlcore.testing.cli_checks",
    "rlcore.testing.logprobs": "rlcore.testing.logprob_reference",
    "rlcore.train_cli": "rlcore.commands.train",
    "rlcore.training.agents": "rlcore.compat.trl.agents",
    "rlcore.training.data": "rlcore.data.cursor",
    "rlcore.training.progress": "rlcore.training.step_progress",
    "rlcore.training.prompts": "rlcore.data.cursor",
    "rlcore.training.reward_models": "rlcore.rewards.models",
    "rlcore.weights": "rlcore.sampling.weight_export",
}


_SWIFT = "rlcore.compat.swift"

#: module -> {name that moved out of it: the module it lives in now}
MOVED_NAMES: dict[str, dict[str, str]] = {
    "rlcore.rollout": {name: _SWIFT for name in (
        "ChatCompletionResponse", "Messages", "extract_logprobs_from_choice",
        "get_token_backed_response_ids", "invoke_async_hook", "remove_response")},
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new
        self._real_spec: Any = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{self.old} moved to {self.new}: import it from there (the old path will be removed)",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system set the alias spec on the module: give it back its own
        module.__spec__ = self._real_spec

    def get_code(self, fullname: str) -> CodeType:
        """What ``python -m OLD`` runs (runpy asks the loader for code): the new module as ``__main__``."""
        warnings.warn(f"{self.old} moved to {self.new}: run python -m {self.new} (the old path will be removed)",
                      DeprecationWarning, stacklevel=2)
        source = f"import runpy\nrunpy.run_module({self.new!r}, run_name='__main__', alter_sys=True)\n"
        return compile(source, f"<{self.old}, moved to {self.new}>", "exec")


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(fullname, new))


def install() -> None:
    """Put the finder at the end of ``sys.meta_path`` (once)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


def _moved_name_getattr(module: ModuleType, names: dict[str, str]) -> Any:
    previous = module.__dict__.get("__getattr__")

    def __getattr__(name: str) -> Any:
        new = names.get(name)
        if new is None:
            if previous is not None:
                return previous(name)
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
        warnings.warn(f"{module.__name__}.{name} moved to {new}: import it from there (the old path will be removed)",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)

    __getattr__._rlcore_moved_names = True  # type: ignore[attr-defined]
    return __getattr__


def install_names() -> None:
    """Give each imported module of :data:`MOVED_NAMES` a ``__getattr__`` for its moved names (once)."""
    for module_name, names in MOVED_NAMES.items():
        module = sys.modules.get(module_name)
        if module is None or getattr(module.__dict__.get("__getattr__"), "_rlcore_moved_names", False):
            continue
        module.__getattr__ = _moved_name_getattr(module, names)  # type: ignore[attr-defined]
