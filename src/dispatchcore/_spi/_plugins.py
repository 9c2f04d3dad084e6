"""Finding executors: entry points of group ``dispatchcore`` through pluggy.

A plugin that fails to load is skipped and remembered, so ``BackendNotFoundError`` can say why.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import threading
import traceback
from dataclasses import dataclass
from typing import Any

import pluggy

from .._base import BackendNotFoundError, RegistrationError, did_you_mean
from ._executor_base import Executor
from ._hookspecs import PROJECT, ExecutorHookSpecs

DISABLE_ENV = "DISPATCHCORE_DISABLED_PLUGINS"


@dataclass
class BackendInfo:
    """One backend as found: where it came from and whether it can run here."""

    name: str
    plugin: str
    distribution: str | None
    executor_cls: type[Executor] | None = None
    error: str | None = None
    missing: tuple[str, ...] = ()
    extra: str | None = None
    disabled: bool = False

    @property
    def available(self) -> bool:
        return self.executor_cls is not None and not self.missing and not self.disabled and self.error is None

    @property
    def install_hint(self) -> str | None:
        """The ``pip install`` line that brings this backend's extra, if known."""
        if self.extra is None:
            return None
        return f'pip install "{self.distribution or PROJECT}[{self.extra}]"'

    @property
    def status(self) -> str:
        if self.disabled:
            return f"disabled by {DISABLE_ENV}"
        if self.error is not None:
            return f"failed to load: {self.error}"
        if self.missing:
            hint = self.install_hint or "install " + ", ".join(self.missing)
            return f"missing {', '.join(self.missing)}: {hint}"
        return "available"


class PluginRegistry:
    """The pluggy manager plus what its plugins registered (or failed to)."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(ExecutorHookSpecs)
        self.backends: dict[str, BackendInfo] = {}
        self.failed_plugins: list[BackendInfo] = []
        self._loaded = False
        self._lock = threading.RLock()

    def _disabled(self) -> set[str]:
        return {p.strip() for p in os.environ.get(DISABLE_ENV, "").split(",") if p.strip()}

    def load(self) -> None:
        """Load every entry point of group ``dispatchcore`` once."""
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            disabled = self._disabled()
            for ep in importlib.metadata.entry_points(group=PROJECT):
                dist = ep.dist.name if ep.dist is not None else None
                if ep.name in disabled:
                    self.failed_plugins.append(BackendInfo(ep.name, ep.value, dist, disabled=True))
                    continue
                if self.manager.has_plugin(ep.name):
                    continue
                try:
                    plugin = ep.load()
                except Exception as exc:  # noqa: BLE001 - a broken plugin must not break others
                    self.failed_plugins.append(_failure(ep.name, ep.value, dist, exc))
                    continue
                self.add_plugin(plugin, ep.name, dist)

    def add_plugin(self, plugin: Any, name: str, distribution: str | None = None) -> None:
        """Register ``plugin`` and run its executor hook (also for in-process plugins)."""
        with self._lock:
            self.manager.register(plugin, name=name)
            disabled = self._disabled()
            for impl in self.manager.hook.dispatchcore_register_executors.get_hookimpls():
                if impl.plugin is not plugin:
                    continue
                try:
                    impl.function(register=lambda cls: self._register(cls, name, distribution, disabled))
                except Exception as exc:  # noqa: BLE001
                    self.failed_plugins.append(_failure(name, name, distribution, exc))

    def _register(self, executor_cls: Any, plugin: str, dist: str | None, disabled: set[str]) -> None:
        if not (isinstance(executor_cls, type) and issubclass(executor_cls, Executor)):
            raise RegistrationError(f"plugin {plugin!r} registered {executor_cls!r}, not an Executor subclass")
        name = executor_cls.name
        if not isinstance(name, str) or not name:
            raise RegistrationError(f"executor {executor_cls.__qualname__} has no `name` attribute")
        if name in self.backends and self.backends[name].executor_cls is not executor_cls:
            other = self.backends[name]
            raise RegistrationError(f"backend {name!r} is registered twice: by {other.plugin} and by {plugin}")
        self.backends[name] = BackendInfo(
            name,
            plugin,
            dist,
            executor_cls=executor_cls,
            missing=tuple(executor_cls.missing_requirements()),
            extra=executor_cls.extra,
            disabled=name in disabled,
        )

    def all(self) -> list[BackendInfo]:
        self.load()
        return sorted(list(self.backends.values()) + self.failed_plugins, key=lambda b: b.name)

    def get(self, name: str) -> type[Executor]:
        """The executor class for ``name``, or :class:`BackendNotFoundError` saying why."""
        self.load()
        available = sorted(b.name for b in self.backends.values() if b.available)
        info = self.backends.get(name) or next((b for b in self.failed_plugins if b.name == name), None)
        if info is not None and info.available and info.executor_cls is not None:
            return info.executor_cls
        if info is None:
            known = [*self.backends, *(b.name for b in self.failed_plugins)]
            raise BackendNotFoundError(
                f"no backend named {name!r}{did_you_mean(str(name), known)}; available backends: {available}. "
                f"Install a plugin that provides it (entry-point group {PROJECT!r}) or pick one of those"
            )
        if info.missing and not info.disabled and info.error is None:
            needs = ", ".join(info.missing)
            fix = f"Run: {info.install_hint}" if info.install_hint else f"Install {needs}"
            raise BackendNotFoundError(
                f"backend {name!r} needs {needs}, which is not installed here. {fix}. Available backends: {available}"
            )
        raise BackendNotFoundError(
            f"backend {name!r} is not usable here ({info.status}). Available backends: {available}"
        )

    def reset(self) -> None:
        """Forget everything and reload on next use (tests; after installing a plugin)."""
        with self._lock:
            for plugin in list(self.manager.get_plugins()):
                self.manager.unregister(plugin)
            self.backends.clear()
            self.failed_plugins.clear()
            self._loaded = False


def _failure(name: str, plugin: str, dist: str | None, exc: BaseException) -> BackendInfo:
    """What a failed plugin shows; a missing module its distribution's extra provides becomes a pip hint."""
    missing = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
    extra = _extra_providing(dist, missing, prefer=name) if missing else None
    if missing and extra:
        return BackendInfo(name, plugin, dist, missing=(missing.split(".")[0],), extra=extra)
    return BackendInfo(name, plugin, dist, error="".join(traceback.format_exception_only(type(exc), exc)).strip())


def _normalize(name: str) -> str:
    return name.strip().lower().replace("-", "_").replace(".", "_")


def _extra_providing(dist: str | None, module: str, prefer: str | None = None) -> str | None:
    """The extra of ``dist`` whose requirements include ``module``'s distribution (``prefer`` wins a tie)."""
    if dist is None:
        return None
    try:
        requirements = importlib.metadata.requires(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    top = _normalize(module.split(".")[0])
    extras = []
    for line in requirements:
        spec, _, marker = line.partition(";")
        req_name = _normalize(re.split(r"[\s\[<>=!~(]", spec.strip(), maxsplit=1)[0])
        found = re.search(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker)
        if req_name == top and found:
            extras.append(found.group(1))
    if prefer in extras:
        return prefer
    return extras[0] if extras else None


registry = PluginRegistry()


def available_backends() -> list[str]:
    """Names of the backends that can run here, sorted."""
    return sorted(b.name for b in registry.all() if b.available)


def replaces_ranks(executor_cls: type[Executor]) -> bool:
    """Whether ``executor_cls`` can start a rank in place of a dead one (it implements ``replace_ranks``)."""
    return executor_cls.replace_ranks is not Executor.replace_ranks


def backends_replacing_ranks() -> list[str]:
    """Names of the backends found (installed or not) whose executor can replace a dead rank, sorted."""
    return sorted(b.name for b in registry.all() if b.executor_cls is not None and replaces_ranks(b.executor_cls))


def get_executor_class(name: str) -> type[Executor]:
    """The executor class registered as ``name``."""
    return registry.get(name)


def register_executor(executor_cls: type[Executor]) -> None:
    """Make ``executor_cls`` a backend in this process, without an entry point (notebooks, tests).

    Registering the same class again is a no-op; another class under a taken name raises.
    """
    registry.load()
    with registry._lock:
        known = registry.backends.get(getattr(executor_cls, "name", ""))
        if known is not None and known.executor_cls is executor_cls:
            return
        registry._register(executor_cls, "in-process", None, registry._disabled())
