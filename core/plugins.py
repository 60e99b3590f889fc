"""Plugin loading, the component registry, and per-run hook managers.

Built-in plugins are ordinary modules registered exactly like third-party ones; third-party plugins
come from the ``rlcore`` entry-point group. ``RLCORE_PLUGINS=dist1,dist2`` limits which installed
distributions load (empty: built-ins only; unset: all). A plugin that fails to import or registers
a taken name is recorded with a one-line error and never takes the others down.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import threading
from typing import Any, Callable, Iterable

import attrs
import pluggy

from . import hookspecs
from .asyncutil import await_me_maybe, gather_maybe
from .errors import PluginError, UnknownComponentError

BUILTIN_PLUGINS: tuple[str, ...] = (
    "rlcore.sampling.plugin",
    "rlcore.rollout.plugin",
    "rlcore.algorithms.plugin",
    "rlcore.rewards",
    "rlcore.tasks",
)

#: component name -> distribution that provides it, for "pip install X" hints on unknown names
KNOWN_PROVIDERS: dict[str, str] = {
    "openenv_scheduler": "rl-plugin-openenv",
    "openenv_tool_scheduler": "rl-plugin-openenv",
    "openenv_reward": "rl-plugin-openenv",
    "openenv": "rl-plugin-openenv",
    "gym_scheduler": "rl-plugin-gym",
    "gym_reward": "rl-plugin-gym",
    "gymnasium": "rl-plugin-gym",
    "math_tip_trick": "rl-plugin-tips",
    "thinking_tips_scheduler": "rl-plugin-tips",
    "gsm8k_accuracy": "rl-plugin-math",
    "gsm8k_format": "rl-plugin-math",
    "math_accuracy": "rl-plugin-math",
    "cosine": "rl-plugin-math",
    "repetition": "rl-plugin-math",
    "soft_overlong": "rl-plugin-math",
    "reasoning_gym": "rl-plugin-reasoning-gym",
    "reasoning_gym_format": "rl-plugin-reasoning-gym",
}


def _normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


@attrs.define
class Component:
    kind: str
    name: str
    factory: Any  # callable, or "module:attr" resolved on first use
    plugin: str
    dist: str
    meta: dict[str, Any] = attrs.field(factory=dict)

    def resolve(self) -> Callable[..., Any]:
        if isinstance(self.factory, str):
            modname, _, attr = self.factory.partition(":")
            try:
                obj: Any = importlib.import_module(modname)
                for part in attr.split("."):
                    obj = getattr(obj, part)
            except Exception as exc:  # noqa: BLE001 - becomes a one-line user error
                raise PluginError(
                    f"{self.kind} {self.name!r} from {self.dist} failed to load ({self.factory}): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            self.factory = obj
        return self.factory


@attrs.define
class PluginRecord:
    """What ``rlcore plugins`` shows for one plugin."""

    name: str
    dist: str
    version: str | None
    builtin: bool
    module: Any = None
    error: str | None = None
    components: dict[str, list[str]] = attrs.field(factory=dict)
    hooks: list[str] = attrs.field(factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.dist if not self.builtin else self.name,
            "plugin": self.name,
            "distribution": self.dist,
            "version": self.version,
            "builtin": self.builtin,
            "hooks": sorted(self.hooks),
            "components": {k: sorted(v) for k, v in self.components.items()},
            "error": self.error,
        }


class Plugins:
    """The loaded plugin set: a pluggy manager, what each plugin registered, and what broke."""

    def __init__(self, allow: Iterable[str] | None = None, builtins: Iterable[str] = BUILTIN_PLUGINS) -> None:
        self.pm = pluggy.PluginManager("rlcore")
        self.pm.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}
        self.registry: dict[str, dict[str, Component]] = {k: {} for k in hookspecs.KINDS}
        self._aliases: dict[str, dict[str, str]] = {k: {} for k in hookspecs.KINDS}
        self.allow = None if allow is None else {_normalize(a) for a in allow}
        for modname in builtins:
            self._register_module(modname, dist="rlcore", builtin=True)
        self._load_entrypoints()
        self._run_registrations()

    # --- loading ----------------------------------------------------------------------------------
    def _register_module(self, modname: str, dist: str, builtin: bool) -> None:
        version = _dist_version(dist)
        try:
            module = importlib.import_module(modname)
            self.pm.register(module, name=modname)
        except Exception as exc:  # noqa: BLE001
            self.records[modname] = PluginRecord(modname, dist, version, builtin, error=_one_line(exc))
            return
        self.records[modname] = PluginRecord(modname, dist, version, builtin, module=module)

    def _load_entrypoints(self) -> None:
        from importlib_metadata import entry_points

        for ep in entry_points(group="rlcore"):
            dist = ep.dist.name if ep.dist is not None else "unknown"
            if self.allow is not None and _normalize(dist) not in self.allow:
                continue
            version = ep.dist.version if ep.dist is not None else None
            if ep.name in self.records:
                self.records[f"{dist}:{ep.name}"] = PluginRecord(
                    ep.name, dist, version, False,
                    error=f"entry point name {ep.name!r} is already used by {self.records[ep.name].dist}; rename it",
                )
                continue
            try:
                plugin = ep.load()
                self.pm.register(plugin, name=ep.name)
            except Exception as exc:  # noqa: BLE001
                self.records[ep.name] = PluginRecord(ep.name, dist, version, False, error=_one_line(exc))
                continue
            self.records[ep.name] = PluginRecord(ep.name, dist, version, False, module=plugin)

    def _run_registrations(self) -> None:
        for rec in self.records.values():
            if rec.module is not None:
                rec.hooks = [hc.name for hc in (self.pm.get_hookcallers(rec.module) or [])]
        for hook_name, kind in hookspecs.KIND_OF_HOOK.items():
            caller = getattr(self.pm.hook, hook_name)
            # get_hookimpls() is in registration order (built-ins first): the first to register a name keeps it
            for impl in caller.get_hookimpls():
                rec = self.records.get(impl.plugin_name)
                if rec is None or rec.error:
                    continue
                try:
                    impl.function(register=self._registrar(kind, rec))
                except Exception as exc:  # noqa: BLE001
                    rec.error = f"{hook_name} raised {_one_line(exc)}"

    def _registrar(self, kind: str, rec: PluginRecord) -> Callable[..., None]:
        def register(name: str, factory: Any, *, aliases: Iterable[str] = (), **meta: Any) -> None:
            if not isinstance(name, str) or not name:
                raise PluginError(f"{rec.dist} registered a {kind} with an invalid name {name!r}")
            for n in (name, *aliases):
                taken = self.registry[kind].get(n) or self.registry[kind].get(self._aliases[kind].get(n, ""))
                if taken is not None:
                    first, second = taken.dist, rec.dist
                    if first == second:
                        first, second = f"{first} ({taken.plugin})", f"{second} ({rec.name})"
                    msg = (
                        f"{kind} name {n!r} is registered by both {first} and {second}; "
                        f"uninstall one of them or rename the {kind}"
                    )
                    rec.error = msg
                    return
            self.registry[kind][name] = Component(kind, name, factory, rec.name, rec.dist, dict(meta))
            for a in aliases:
                self._aliases[kind][a] = name
            rec.components.setdefault(kind, []).append(name)

        return register

    # --- lookup -----------------------------------------------------------------------------------
    def component(self, kind: str, name: str) -> Component:
        if kind not in self.registry:
            raise UnknownComponentError(f"unknown component kind {kind!r}; kinds are: {', '.join(hookspecs.KINDS)}")
        reg = self.registry[kind]
        comp = reg.get(name) or reg.get(self._aliases[kind].get(name, ""))
        if comp is not None:
            return comp
        raise UnknownComponentError(self._unknown_message(kind, name))

    def get(self, kind: str, name: str) -> Callable[..., Any]:
        return self.component(kind, name).resolve()

    def available(self, kind: str) -> list[str]:
        if kind not in self.registry:
            raise UnknownComponentError(f"unknown component kind {kind!r}; kinds are: {', '.join(hookspecs.KINDS)}")
        return sorted(self.registry[kind])

    def _unknown_message(self, kind: str, name: str) -> str:
        have = ", ".join(self.available(kind)) or "none"
        provider = KNOWN_PROVIDERS.get(name)
        msg = f"no {kind} named {name!r}; available: {have}"
        if provider:
            broken = [r for r in self.records.values() if _normalize(r.dist) == _normalize(provider) and r.error]
            if broken:
                return f"{kind} {name!r} comes from {provider}, which failed to load: {broken[0].error}"
            if self.allow is not None and _normalize(provider) not in self.allow and _dist_version(provider):
                return f"{msg} ({provider} is installed but not in RLCORE_PLUGINS)"
            msg += f"; it is provided by {provider}: pip install {provider}"
            return msg
        broken = [r for r in self.records.values() if r.error and not r.builtin]
        if broken:
            msg += "; plugins that failed to load may provide it: " + "; ".join(f"{r.dist}: {r.error}" for r in broken)
        return msg

    def list(self) -> list[PluginRecord]:
        return list(self.records.values())

    def observers(self) -> list[Any]:
        """Loaded plugin modules that implement lifecycle hooks: active in every run."""
        out = []
        for rec in self.records.values():
            if rec.module is not None and any(h in hookspecs.LIFECYCLE_HOOKS for h in rec.hooks):
                out.append(rec.module)
        return out

    def register_commands(self, cli: Any) -> None:
        for impl in self.pm.hook.register_commands.get_hookimpls():
            rec = self.records.get(impl.plugin_name)
            if rec is None or rec.error:
                continue
            try:
                impl.function(cli=cli)
            except Exception as exc:  # noqa: BLE001
                rec.error = f"register_commands raised {_one_line(exc)}"


def _dist_version(dist: str) -> str | None:
    from importlib_metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- the process-wide plugin set -------------------------------------------------------------------
_lock = threading.Lock()
_plugins: Plugins | None = None


def _allow_from_env() -> list[str] | None:
    raw = os.environ.get("RLCORE_PLUGINS")
    if raw is None:
        return None
    return [x.strip() for x in raw.split(",") if x.strip()]


def plugins() -> Plugins:
    """The loaded plugin set (loaded on first use, honouring ``RLCORE_PLUGINS``)."""
    global _plugins
    with _lock:
        if _plugins is None:
            _plugins = Plugins(allow=_allow_from_env())
        return _plugins


def reload_plugins() -> Plugins:
    """Forget the loaded plugins and load again (after installing a package, or in tests)."""
    global _plugins
    with _lock:
        _plugins = None
    importlib.invalidate_caches()
    return plugins()


def get(kind: str, name: str) -> Callable[..., Any]:
    """The factory registered as ``name`` of ``kind`` (scheduler, env, reward, loss, advantage, sampler)."""
    return plugins().get(kind, name)


def available(kind: str) -> list[str]:
    """Names registered for ``kind``."""
    return plugins().available(kind)


# --- per-run hooks ---------------------------------------------------------------------------------
class RunHooks:
    """A pluggy manager for one run: the active components' lifecycle hooks plus observer plugins.

    Components registered later are called first, so a run's chosen scheduler wins ``step`` and
    ``check_finished`` over built-in defaults (which are ``trylast``).
    """

    def __init__(self, *components: Any, observers: bool = True) -> None:
        self.pm = pluggy.PluginManager("rlcore")
        self.pm.add_hookspecs(hookspecs)
        if observers:
            for module in plugins().observers():
                self.pm.register(module)
        for comp in components:
            self.add(comp)

    def add(self, component: Any) -> None:
        if component is not None and not self.pm.is_registered(component):
            self.pm.register(component)

    def implemented(self, hook: str) -> bool:
        return bool(getattr(self.pm.hook, hook).get_hookimpls())

    async def call_all(self, hook: str, **kwargs: Any) -> list[Any]:
        """Every implementation's result in call order, ``None`` dropped. Async implementations run
        concurrently (several async rewards overlap)."""
        results = await gather_maybe(getattr(self.pm.hook, hook)(**kwargs))
        return [r for r in results if r is not None]

    async def call_first(self, hook: str, **kwargs: Any) -> Any:
        """The first non-``None`` result, trying implementations in call order (async ones awaited)."""
        caller = getattr(self.pm.hook, hook)
        for impl in _call_order(caller.get_hookimpls()):
            args = [kwargs[a] for a in impl.argnames]
            r = await await_me_maybe(impl.function(*args))
            if r is not None:
                return r
        return None


def _call_order(impls: list[Any]) -> list[Any]:
    """pluggy stores impls trylast..tryfirst in ascending priority and calls them reversed."""
    return list(reversed(impls))
