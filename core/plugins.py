"""Plugin loading, the component registry, and per-run hook managers.

Built-in plugins are ordinary modules registered exactly like third-party ones; third-party plugins
come from the ``rlcore`` entry-point group. ``RLCORE_PLUGINS=dist1,dist2`` limits which installed
distributions load (empty: built-ins only; unset: all). A plugin that fails to import is recorded
with a one-line error and never takes the others down — whatever it raises: ``sys.exit()`` at import
(``SystemExit``) and a ``KeyboardInterrupt`` the plugin raises itself are its error too. A real
Ctrl-C (SIGINT) while plugins load still stops the command. A factory that is not callable (or a
``"module:attr"`` string) is refused when it is registered.

Two packages registering the same name (an ms-swift port registering ``gym_scheduler`` next to
rl-plugin-gym): the first to register keeps the plain name — built-ins first, then distributions in
alphabetical order — and every other component of both still loads. The clash is shown by
``rlcore plugins``; either one stays reachable as ``DIST:NAME`` (``--scheduler my-port:gym_scheduler``),
and ``RLCORE_PREFER=NAME=DIST[,…]`` makes a distribution own a plain name.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import threading
import types
from typing import Any, Callable, Iterable

import attrs
import pluggy

from . import hookspecs
from .asyncutil import await_me_maybe, gather_maybe
from .errors import PluginError, UnknownComponentError
from .errors import one_line as _one_line

BUILTIN_PLUGINS: tuple[str, ...] = (
    "rlcore.builtin_components",
    "rlcore.rewards",
    "rlcore.data.tasks",
    "rlcore.training.prompt_sampler",
)

#: the entry-point group where a plugin distribution declares the component names it registers
#: (``gym_scheduler = "rl_plugin_gym"``), read as metadata without importing anything: an unknown
#: name that an installed but unloaded (or broken) distribution declares is answered by naming it
COMPONENTS_GROUP = "rlcore.components"


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
            with _Interrupts() as interrupts:
                try:
                    obj: Any = importlib.import_module(modname)
                    for part in attr.split("."):
                        obj = getattr(obj, part)
                except BaseException as exc:  # noqa: BLE001 - becomes a one-line user error (sys.exit() too)
                    if not interrupts.plugin_raised(exc):
                        raise
                    raise PluginError(
                        f"{self.kind} {self.name!r} from {self.dist} failed to load ({self.factory}): {_load_error(exc)}"
                    ) from exc
            if not callable(obj):
                raise PluginError(f"{self.kind} {self.name!r} from {self.dist} is {self.factory}, which is "
                                  f"{_shown(obj)}, not a function or class")
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
    #: names this plugin registered that another distribution also registered (not an error)
    clashes: list[str] = attrs.field(factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.dist if not self.builtin else self.name,
            "plugin": self.name,
            "distribution": self.dist,
            "version": self.version,
            "builtin": self.builtin,
            "hooks": sorted(self.hooks),
            "components": {k: sorted(v) for k, v in self.components.items()},
            "clashes": list(self.clashes),
            "error": self.error,
        }


class Plugins:
    """The loaded plugin set: a pluggy manager, what each plugin registered, and what broke."""

    def __init__(
        self,
        allow: Iterable[str] | None = None,
        builtins: Iterable[str] = BUILTIN_PLUGINS,
        prefer: dict[str, str] | None = None,
    ) -> None:
        self.pm = pluggy.PluginManager("rlcore")
        self.pm.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}
        self.registry: dict[str, dict[str, Component]] = {k: {} for k in hookspecs.KINDS}
        #: kind -> name -> components of the same name that lost the plain name (reachable as DIST:NAME)
        self.shadowed: dict[str, dict[str, list[Component]]] = {k: {} for k in hookspecs.KINDS}
        self._aliases: dict[str, dict[str, str]] = {k: {} for k in hookspecs.KINDS}
        self.allow = None if allow is None else {_normalize(a) for a in allow}
        self.prefer = {name: _normalize(dist) for name, dist in (prefer or {}).items()}
        for modname in builtins:
            self._register_module(modname, dist="rlcore", builtin=True)
        self._load_entrypoints()
        self._run_registrations()
        self._apply_preferences()

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

        eps = sorted(entry_points(group="rlcore"), key=lambda e: (_normalize(_ep_dist(e)), e.name))
        for ep in eps:  # alphabetical by distribution: which one keeps a clashing name does not vary
            dist = _ep_dist(ep)
            if self.allow is not None and _normalize(dist) not in self.allow:
                continue
            try:
                version = ep.dist.version if ep.dist is not None else None
            except Exception:  # noqa: BLE001
                version = None
            if ep.name in self.records:
                self.records[f"{dist}:{ep.name}"] = PluginRecord(
                    ep.name, dist, version, False,
                    error=f"entry point name {ep.name!r} is already used by {self.records[ep.name].dist}; rename it",
                )
                continue
            with _Interrupts() as interrupts:
                try:
                    plugin = ep.load()
                    self.pm.register(plugin, name=ep.name)
                except BaseException as exc:  # noqa: BLE001 - sys.exit() at import is this plugin's error too
                    if not interrupts.plugin_raised(exc):
                        raise  # a real Ctrl-C stops the command
                    self.records[ep.name] = PluginRecord(ep.name, dist, version, False, error=_load_error(exc))
                    continue
            self.records[ep.name] = PluginRecord(ep.name, dist, version, False, module=plugin)
        self._note_unknown_allowed({_normalize(_ep_dist(ep)) for ep in eps})

    def _note_unknown_allowed(self, installed: set[str]) -> None:
        """A name in ``RLCORE_PLUGINS`` that no installed distribution answers to (a typo, a package
        not installed) is an error record, so ``rlcore plugins`` and every unknown-name error show
        it instead of the run quietly loading nothing."""
        missing = sorted((self.allow or set()) - installed - {"rlcore"})
        known = ", ".join(sorted(installed - {"unknown"})) or "none"
        for name in missing:
            self.records[f"RLCORE_PLUGINS:{name}"] = PluginRecord(
                name, name, None, False,
                error=f"RLCORE_PLUGINS names {name!r}, but no installed distribution with an rlcore entry point is "
                      f"called that (installed: {known}); pip install it or fix the name",
            )

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
                with _Interrupts() as interrupts:
                    try:
                        impl.function(register=self._registrar(kind, rec))
                    except BaseException as exc:  # noqa: BLE001
                        if not interrupts.plugin_raised(exc):
                            raise
                        rec.error = f"{hook_name} raised {_load_error(exc)}"

    def _registrar(self, kind: str, rec: PluginRecord) -> Callable[..., None]:
        def register(name: str, factory: Any, *, aliases: Iterable[str] = (), **meta: Any) -> None:
            if not isinstance(name, str) or not name or ":" in name:
                raise PluginError(f"{rec.dist} registered a {kind} with an invalid name {name!r}")
            if not callable(factory) and not (isinstance(factory, str) and re.fullmatch(r"[\w.]+:[\w.]+", factory)):
                raise PluginError(f"{rec.dist} registered {kind} {name!r} as {_shown(factory)}, which is not callable; "
                                  "register a function or class (or a 'module:attr' string naming one)")
            comp = Component(kind, name, factory, rec.name, rec.dist, dict(meta))
            rec.components.setdefault(kind, []).append(name)
            taken = self._lookup(kind, name)
            if taken is not None:
                self._clash(kind, name, taken, comp, rec)
                return
            self.registry[kind][name] = comp
            for a in aliases:
                other = self._lookup(kind, a)
                if other is not None:
                    self._clash(kind, a, other, comp, rec)
                else:
                    self._aliases[kind][a] = name

        return register

    def _lookup(self, kind: str, name: str) -> Component | None:
        reg = self.registry[kind]
        return reg.get(name) or reg.get(self._aliases[kind].get(name, ""))

    def _clash(self, kind: str, name: str, keeper: Component, loser: Component, rec: PluginRecord) -> None:
        """Same name from two plugins: the first keeps it, the second stays reachable as DIST:NAME."""
        self.shadowed[kind].setdefault(name, []).append(loser)
        note = (f"{kind} {name!r} is registered by both {keeper.dist} and {loser.dist}; {keeper.dist} keeps "
                f"the name, use '{loser.dist}:{name}' or RLCORE_PREFER={name}={loser.dist} for the other")
        for r in (rec, self.records.get(keeper.plugin)):
            if r is not None and note not in r.clashes:
                r.clashes.append(note)

    def _apply_preferences(self) -> None:
        for name, dist in self.prefer.items():
            for kind in hookspecs.KINDS:
                pick = next((c for c in self.shadowed[kind].get(name, []) if _normalize(c.dist) == dist), None)
                if pick is not None:
                    current = self.registry[kind][name]
                    self.shadowed[kind][name] = [c for c in self.shadowed[kind][name] if c is not pick] + [current]
                    self.registry[kind][name] = pick

    # --- lookup -----------------------------------------------------------------------------------
    def component(self, kind: str, name: str) -> Component:
        """The component ``name`` of ``kind``; ``DIST:NAME`` picks one distribution's when two clash."""
        if kind not in self.registry:
            raise UnknownComponentError(f"unknown component kind {kind!r}; kinds are: {', '.join(hookspecs.KINDS)}")
        if ":" in name:
            dist, _, plain = name.partition(":")
            for c in [self._lookup(kind, plain), *self.shadowed[kind].get(plain, [])]:
                if c is not None and _normalize(c.dist) == _normalize(dist):
                    return c
            raise UnknownComponentError(f"{dist} registers no {kind} named {plain!r}; {self._unknown_message(kind, plain)}")
        comp = self._lookup(kind, name)
        if comp is not None:
            return comp
        raise UnknownComponentError(self._unknown_message(kind, name))

    def get(self, kind: str, name: str) -> Callable[..., Any]:
        return self.component(kind, name).resolve()

    def available(self, kind: str) -> list[str]:
        if kind not in self.registry:
            raise UnknownComponentError(f"unknown component kind {kind!r}; kinds are: {', '.join(hookspecs.KINDS)}")
        return sorted(self.registry[kind])

    def aliases(self, kind: str) -> dict[str, list[str]]:
        """``{name: [alias, …]}`` for ``kind``'s components registered with aliases (``openai``: ``vllm_server``)."""
        out: dict[str, list[str]] = {}
        for alias, name in sorted(self._aliases.get(kind, {}).items()):
            out.setdefault(name, []).append(alias)
        return out

    def _unknown_message(self, kind: str, name: str) -> str:
        have = ", ".join(self.available(kind)) or "none"
        msg = f"no {kind} named {name!r}; available: {have}"
        provider = provider_of(name)
        if provider:
            broken = [r for r in self.records.values() if _normalize(r.dist) == _normalize(provider) and r.error]
            if broken:
                return f"{kind} {name!r} comes from {provider}, which failed to load: {broken[0].error}"
            if self.allow is not None and _normalize(provider) not in self.allow:
                return f"{msg} ({provider} is installed but not in RLCORE_PLUGINS)"
            return f"{msg}; {provider} declares it but did not register it: reinstall {provider}"
        broken = [r for r in self.records.values() if r.error and not r.builtin]
        if broken:
            msg += "; plugins that failed to load may provide it: " + "; ".join(f"{r.dist}: {r.error}" for r in broken)
        return msg

    def list(self) -> list[PluginRecord]:
        return list(self.records.values())

    def observers(self) -> list[Any]:
        """Loaded plugin modules that implement lifecycle hooks: the observers a run may name."""
        out = []
        for rec in self.records.values():
            if rec.module is not None and not rec.builtin and any(h in hookspecs.LIFECYCLE_HOOKS for h in rec.hooks):
                out.append(rec.module)
        return out

    def observer(self, name: str) -> tuple[Any, str]:
        """The observer plugin a run names (entry-point name or distribution), and its label."""
        for rec in self.records.values():
            if rec.module is None or rec.builtin:
                continue
            if name in (rec.name, rec.dist) or _normalize(name) == _normalize(rec.dist):
                if not any(h in hookspecs.LIFECYCLE_HOOKS for h in rec.hooks):
                    raise UnknownComponentError(f"plugin {name!r} ({rec.dist}) implements no lifecycle hook; it cannot observe a run")
                return rec.module, rec.name
        have = ", ".join(sorted(r.name for r in self.records.values() if r.module is not None and not r.builtin
                                and any(h in hookspecs.LIFECYCLE_HOOKS for h in r.hooks))) or "none installed"
        raise UnknownComponentError(f"no observer plugin named {name!r}; observers: {have}")

    def register_commands(self, cli: Any) -> None:
        for impl in self.pm.hook.register_commands.get_hookimpls():
            rec = self.records.get(impl.plugin_name)
            if rec is None or rec.error:
                continue
            with _Interrupts() as interrupts:
                try:
                    impl.function(cli=cli)
                except BaseException as exc:  # noqa: BLE001
                    if not interrupts.plugin_raised(exc):
                        raise
                    rec.error = f"register_commands raised {_load_error(exc)}"


class _Interrupts:
    """Tells a real Ctrl-C from a plugin's own ``KeyboardInterrupt`` while plugin code runs: in the
    main thread, SIGINT's handler is wrapped to note that the signal came (and then does what it did).

    Why: a plugin that raises ``KeyboardInterrupt`` (or calls ``sys.exit()``) at import took every
    command down with a traceback (or its bare message), naming no plugin; but a user's Ctrl-C while
    a slow plugin imports must still stop the command."""

    def __init__(self) -> None:
        self.signalled = False
        self._previous: Any = None
        self._handler: Any = None

    def __enter__(self) -> "_Interrupts":
        import signal

        if threading.current_thread() is not threading.main_thread():
            return self  # signals reach the main thread only: a KeyboardInterrupt here is the plugin's own
        try:
            previous = signal.getsignal(signal.SIGINT)
        except (ValueError, OSError):  # pragma: no cover - no signal support
            return self
        if not callable(previous):
            return self  # SIG_IGN / SIG_DFL: a Ctrl-C raises nothing here

        def on_sigint(signum: int, frame: Any) -> Any:
            self.signalled = True
            return previous(signum, frame)

        signal.signal(signal.SIGINT, on_sigint)
        self._previous, self._handler = previous, on_sigint
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal

        if self._handler is not None and signal.getsignal(signal.SIGINT) is self._handler:
            signal.signal(signal.SIGINT, self._previous)  # (a plugin that set its own handler keeps it)

    def plugin_raised(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the plugin's failure (recorded), not a real Ctrl-C (re-raised)."""
        return not (isinstance(exc, KeyboardInterrupt) and self.signalled)


def _load_error(exc: BaseException) -> str:
    """The one-line error of a plugin that failed while it loaded, saying so for the exits that are
    not errors elsewhere (``sys.exit()``, a ``KeyboardInterrupt`` the plugin raised itself)."""
    if isinstance(exc, SystemExit):
        said = f"sys.exit({exc.code!r})" if not isinstance(exc.code, str) else f"sys.exit({exc.code[:200]!r})"
        return f"SystemExit: the plugin called {said} while loading".splitlines()[0]
    if isinstance(exc, KeyboardInterrupt):
        return "KeyboardInterrupt: raised by the plugin itself while loading (not a Ctrl-C)"
    return _one_line(exc)


def _shown(obj: Any) -> str:
    """``42 (int)``: a value and its type, short, for a one-line error."""
    text = repr(obj)
    return f"{text if len(text) <= 60 else text[:57] + '...'} ({type(obj).__name__})"


def _ep_dist(ep: Any) -> str:
    """An entry point's distribution name ("unknown" when its metadata is missing or half-installed)."""
    try:
        return ep.dist.name if ep.dist is not None else "unknown"
    except Exception:  # noqa: BLE001 - a broken install elsewhere must not stop plugin loading
        return "unknown"


def provider_of(name: str) -> str | None:
    """The installed distribution that declares component ``name`` in its ``rlcore.components``
    entry points (the first alphabetically when several do), or None. Reads metadata only."""
    from importlib_metadata import entry_points

    try:
        eps = [ep for ep in entry_points(group=COMPONENTS_GROUP) if ep.name == name]
    except Exception:  # noqa: BLE001 - a broken install elsewhere must not hide the real error
        return None
    dists = sorted({_ep_dist(ep) for ep in eps} - {"unknown"}, key=_normalize)
    return dists[0] if dists else None


def _dist_version(dist: str) -> str | None:
    from importlib_metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


# --- the process-wide plugin set -------------------------------------------------------------------
_lock = threading.Lock()
_plugins: Plugins | None = None


def _allow_from_env() -> list[str] | None:
    raw = os.environ.get("RLCORE_PLUGINS")
    if raw is None:
        return None
    return [x.strip() for x in raw.split(",") if x.strip()]


def _prefer_from_env() -> dict[str, str]:
    """``RLCORE_PREFER="gym_scheduler=my-swift-port,other=dist"`` → ``{name: dist}``."""
    out: dict[str, str] = {}
    for item in (os.environ.get("RLCORE_PREFER") or "").split(","):
        name, eq, dist = item.strip().partition("=")
        if eq and name.strip() and dist.strip():
            out[name.strip()] = dist.strip()
        elif item.strip():
            raise PluginError(f"RLCORE_PREFER entry {item.strip()!r} is not NAME=DISTRIBUTION")
    return out


def plugins() -> Plugins:
    """The loaded plugin set (loaded on first use, honouring ``RLCORE_PLUGINS`` and ``RLCORE_PREFER``)."""
    global _plugins
    with _lock:
        if _plugins is None:
            _plugins = Plugins(allow=_allow_from_env(), prefer=_prefer_from_env())
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
    """A pluggy manager for one run: the components the run chose plus the observers it names.

    ``components`` (reward objects, an advantage estimator …) answer the hooks they implement.
    Observers are opt-in per run: ``observers`` names installed plugins (entry-point or
    distribution name), ``observer_objects`` passes objects. An installed package that merely
    implements a lifecycle hook takes no part unless named. Observers are called separately
    (:meth:`call_observers`): what they return is logged, never trained on.
    """

    def __init__(
        self,
        *components: Any,
        observers: Iterable[str] | bool = (),
        observer_objects: Iterable[Any] = (),
    ) -> None:
        self.pm = pluggy.PluginManager("rlcore")
        self.pm.add_hookspecs(hookspecs)
        self.observer_names: dict[str, str] = {}  # pluggy plugin name -> display name
        names = [] if isinstance(observers, bool) else list(observers)
        for name in names:
            module, label = plugins().observer(name)
            self.observer_names[self.pm.register(module, name=f"observer:{label}") or f"observer:{label}"] = label
        for obj in observer_objects:
            if obj is not None and not self.pm.is_registered(obj):
                label = getattr(obj, "name", None) or type(obj).__name__
                self.observer_names[self.pm.register(obj) or ""] = str(label)
        for comp in components:
            self.add(comp)

    def add(self, component: Any) -> None:
        if component is not None and not self.pm.is_registered(component):
            self.pm.register(component)

    def implemented(self, hook: str) -> bool:
        return bool(getattr(self.pm.hook, hook).get_hookimpls())

    def _components_caller(self, hook: str) -> Any:
        if not self.observer_names:
            return getattr(self.pm.hook, hook)
        observers = [self.pm.get_plugin(n) for n in self.observer_names]
        return self.pm.subset_hook_caller(hook, remove_plugins=[o for o in observers if o is not None])

    async def call_all(self, hook: str, **kwargs: Any) -> list[Any]:
        """Every component's result in pluggy's call order, ``None`` dropped (observers excluded).
        Async implementations run concurrently (several async rewards overlap)."""
        results = await gather_maybe(self._components_caller(hook)(**kwargs))
        return [r for r in results if r is not None]

    async def call_first(self, hook: str, **kwargs: Any) -> Any:
        """A ``firstresult`` hook's result: pluggy picks the implementation (its own order and
        ``tryfirst``/``trylast``), an async one's coroutine is awaited."""
        caller = self._components_caller(hook)
        result = caller(**kwargs)
        if not (caller.spec and caller.spec.opts.get("firstresult")):  # a collect-all hook: the first non-None
            result = next((r for r in await gather_maybe(result) if r is not None), None)
        return await await_me_maybe(result)

    async def call_observers(self, hook: str, **kwargs: Any) -> dict[str, Any]:
        """Each named observer's result for ``hook`` (by observer name); an observer that raises is
        recorded as ``{"error": ...}`` — observing never fails a trajectory."""
        out: dict[str, Any] = {}
        if not self.observer_names:
            return out
        for impl in getattr(self.pm.hook, hook).get_hookimpls():
            label = self.observer_names.get(impl.plugin_name)
            if label is None:
                continue
            try:
                r = await await_me_maybe(impl.function(*[kwargs[a] for a in impl.argnames]))
            except Exception as exc:  # noqa: BLE001
                r = {"infos": {"error": _one_line(exc)}}
            if r is not None:
                out[label] = r
        return out


# --- ``rlcore.plugins`` is this module and the loaded set at once ------------------------------------
class _CallableModule(types.ModuleType):
    """``rlcore.plugins()`` (the loaded plugin set) predates this module's name, and a function named
    like its module shadows it (``import rlcore.plugins as p`` gave the function). Calling the module
    returns :func:`plugins`, so ``rlcore.plugins`` is the module and ``rlcore.plugins()`` still works."""

    def __call__(self) -> Plugins:
        return plugins()


sys.modules[__name__].__class__ = _CallableModule
