"""Plug-in loading and the named registries of drafters, controllers, verifiers and adapters.

Plug-ins come from the ``eesd`` entry-point group, built-ins included. Two environment variables
filter them by entry-point name: ``EESD_LOAD_PLUGINS`` (comma-separated allow-list) and
``EESD_DISABLE_PLUGINS`` (block-list). Each registration hook is called once per plug-in with a
registrar that knows which plug-in is registering. A plug-in that fails to load or register is
left out with a warning (``Manager.broken``), or is an error under ``EESD_STRICT_PLUGINS=1``.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import threading
import types
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy
from pydantic import BaseModel

from eesd_core import hookspecs
from eesd_core.errors import InputError, PluginError, PluginFault, PluginLoadError, UnknownPluginError
from eesd_core.protocols import contract_breaches

GROUP = "eesd"
KINDS = {
    "drafter": "eesd_register_drafters",
    "controller": "eesd_register_controllers",
    "verifier": "eesd_register_verifiers",
    "model_adapter": "eesd_register_model_adapters",
}
_NAME = re.compile(r"^[a-z][a-z0-9_\-.]*$")


@dataclass(frozen=True)
class Entry:
    """One registered component: its name, factory, options model and where it came from."""

    kind: str
    name: str
    factory: Any
    options: type[BaseModel] | None
    plugin: str


@dataclass(frozen=True)
class PluginInfo:
    """A loaded plug-in: entry-point name, distribution and version, implemented hooks."""

    name: str
    distribution: str | None
    version: str | None
    hooks: tuple[str, ...]


class Registry:
    """The components of one kind, by name."""

    def __init__(self, kind: str, broken: Iterable[str] = ()) -> None:
        self.kind, self.broken = kind, sorted(broken)
        self._entries: dict[str, Entry] = {}

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def names(self) -> list[str]:
        return sorted(self._entries)

    def get(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownPluginError(
                f"No {self.kind} named {name!r}. Registered {self.kind}s: "
                f"{', '.join(self.names()) or 'none'}. Check the spelling, or install the plug-in "
                "that provides it (`eesd plugins` lists what is loaded"
                + (f"; left out for errors: {', '.join(self.broken)})." if self.broken else ").")
            ) from None


class Registrar:
    """What a registration hook receives: ``register.add(name, factory, options=...)``."""

    def __init__(self, registry: Registry, plugin: str) -> None:
        self._registry, self.plugin = registry, plugin

    def add(self, name: str, factory: Callable[..., Any], options: type[BaseModel] | None = None) -> None:
        where = f"plug-in {self.plugin!r} registering {self._registry.kind} {name!r}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise PluginError(f"{where}: names are lowercase identifiers like 'my_controller', got {name!r}.")
        if not callable(factory):
            raise PluginError(f"{where}: the factory must be callable, got {factory!r}.")
        if options is not None and not (isinstance(options, type) and issubclass(options, BaseModel)):
            raise PluginError(f"{where}: options must be a pydantic model class, got {options!r}.")
        if isinstance(factory, type) and (breaches := contract_breaches(self._registry.kind, factory)):
            raise PluginFault(f"{where}: {factory.__name__} breaks the protocol: {'; '.join(breaches)}.")
        if first := self._registry._entries.get(name):
            raise PluginError(
                f"{self._registry.kind} name {name!r} is registered by both plug-in {first.plugin!r} and "
                f"plug-in {self.plugin!r}. Uninstall or disable one of them (EESD_DISABLE_PLUGINS=name)."
            )
        self._registry._entries[name] = Entry(self._registry.kind, name, factory, options, self.plugin)


FILTERS = ("EESD_LOAD_PLUGINS", "EESD_DISABLE_PLUGINS")


def _names(variable: str) -> list[str]:
    return [n.strip() for n in os.environ.get(variable, "").split(",") if n.strip()]


def _selected(name: str) -> bool:
    allow = _names("EESD_LOAD_PLUGINS")
    return (not allow or name in allow) and name not in _names("EESD_DISABLE_PLUGINS")


def _check_filters(found: list[str]) -> None:
    """A filter naming no installed plug-in is a typo, not a request for nothing."""
    for variable in FILTERS:
        if unknown := [n for n in _names(variable) if n not in found]:
            raise PluginLoadError(
                f"{variable} names {', '.join(map(repr, unknown))}, but no installed eesd plug-in is "
                f"called that. Installed plug-ins: {', '.join(sorted(found)) or 'none'}."
            )


class Manager:
    """A pluggy plugin manager for project ``eesd`` plus the registries its plug-ins fill."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("eesd")
        self.pm.add_hookspecs(hookspecs)
        self.info: dict[str, PluginInfo] = {}
        self.broken: dict[str, str] = {}  # plug-ins left out, with why
        self._registries: dict[str, Registry] | None = None

    def load_entry_points(self, entry_points: Iterable[metadata.EntryPoint] | None = None) -> None:
        """Import and register every selected entry point of the ``eesd`` group."""
        points = metadata.entry_points(group=GROUP) if entry_points is None else entry_points
        found = sorted(points, key=lambda e: e.name)
        _check_filters([ep.name for ep in found])
        for ep in found:
            if not _selected(ep.name) or self.pm.has_plugin(ep.name):
                continue
            dist = getattr(ep, "dist", None)
            dist_name, version = (dist.metadata["Name"], dist.version) if dist is not None else (None, None)
            try:
                self.register(ep.load(), ep.name, dist_name, version)
                self.check_pending()
            except Exception as exc:
                where = f"({ep.value}) from distribution {dist_name or 'unknown'} {version or ''}"
                self._broken(ep.name, f"Could not load eesd plug-in {ep.name!r} {where}", exc)

    def _broken(self, name: str, problem: str, exc: Exception) -> None:
        """Leave plug-in ``name`` out with a warning, or raise where plug-ins must all load."""
        message = f"{problem}: {type(exc).__name__}: {exc} Reinstall or upgrade it, or skip it with "
        message += f"EESD_DISABLE_PLUGINS={name}."
        if os.environ.get("EESD_STRICT_PLUGINS", "") not in ("", "0"):
            raise exc if isinstance(exc, PluginError) else PluginLoadError(f"{message} (strict)") from exc
        self.pm.unregister(name=name) if self.pm.has_plugin(name) else None
        self.info.pop(name, None)
        self.broken[name] = message
        warnings.warn(f"{message} It is left out.", RuntimeWarning, stacklevel=3)

    def check_pending(self) -> None:
        """Every hook implementation must match a spec: a misspelt hook is an error, not a no-op."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginLoadError(f"{exc}: a hook not in eesd_core.hookspecs; check its spelling.") from None

    def register(
        self, plugin: Any, name: str, distribution: str | None = None, version: str | None = None
    ) -> None:
        """Register a plug-in object by hand (tests, in-process plug-ins)."""
        try:
            self.pm.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise PluginLoadError(f"Plug-in {name!r} is malformed: {exc}") from exc
        hooks = tuple(sorted(h.name for h in self.pm.get_hookcallers(plugin) or ()))
        self.info[name] = PluginInfo(name, distribution, version, hooks)
        self._registries = None

    def registry(self, kind: str) -> Registry:
        if self._registries is None:
            self._registries = self._collect()
        return self._registries[kind]

    def _collect(self) -> dict[str, Registry]:
        registries = {kind: Registry(kind, self.broken) for kind in KINDS}
        for kind, hook_name in KINDS.items():
            for impl in reversed(getattr(self.pm.hook, hook_name).get_hookimpls()):
                name = impl.plugin_name
                try:
                    impl.function(register=Registrar(registries[kind], name))
                except Exception as exc:
                    self._broken(name, f"eesd plug-in {name!r} failed in {hook_name}", exc)
                    return self._collect()
        return registries

    def has_observers(self, hook_name: str) -> bool:
        return bool(getattr(self.pm.hook, hook_name).get_hookimpls())


def register(
    kind: str, name: str, factory: Callable[..., Any], options: type[BaseModel] | None = None
) -> None:
    """Register a drafter, controller, verifier or model adapter from this process (a notebook, a
    test), checked as an entry point's would be; registering ``name`` again replaces it."""
    if kind not in KINDS:
        raise PluginError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}.")
    Registrar(Registry(kind), "in-process").add(name, factory, options)  # the checks, now
    manager, plugin = get_manager(), f"in-process {kind} {name}"
    if manager.pm.has_plugin(plugin):
        manager.pm.unregister(name=plugin)
    elif name in manager.registry(kind).names():
        raise PluginError(f"A {kind} named {name!r} is registered already by a plug-in: choose another name.")
    hook = hookspecs.hookimpl(lambda register: register.add(name, factory, options))
    manager.register(types.SimpleNamespace(**{KINDS[kind]: hook}), plugin)


_manager: Manager | None = None
_loading = threading.Lock()


def get_manager() -> Manager:
    """The process-wide manager, loaded from entry points on first use (once, whatever the threads)."""
    global _manager
    if _manager is None:
        with _loading:
            if _manager is None:
                manager = Manager()
                manager.load_entry_points()
                _manager = manager
    return _manager


def reset_manager(manager: Manager | None = None) -> None:
    """Forget the loaded plug-ins (or install ``manager``): the next use loads them anew."""
    global _manager
    _manager = manager


_MODEL_WAYS = (
    "pass a local Hugging Face checkpoint directory that holds config.json, or a name from "
    "`eesd models list` (plug-in eesd_models; `eesd plugins` shows whether it is loaded)."
)


def resolve_model(name_or_path: Any, cache_dir: Any = None) -> Path:
    """A checkpoint directory for what a user typed: a local directory as is, else whatever a
    plug-in makes of the name (hook ``eesd_resolve_model``; ``eesd_models`` fetches known models)."""
    path, name = Path(name_or_path).expanduser(), str(name_or_path)
    if path.is_dir() and not (path / "config.json").is_file():
        raise InputError(f"{str(path)!r} is a directory but holds no config.json: {_MODEL_WAYS}")
    cache = None if cache_dir is None else str(cache_dir)
    found = path if path.is_dir() else get_manager().pm.hook.eesd_resolve_model(name=name, cache_dir=cache)
    if found is None:
        raise InputError(
            f"{name!r} is neither a checkpoint directory nor a model name a plug-in knows: {_MODEL_WAYS}"
        )
    return Path(found)
