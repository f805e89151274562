"""Find provider plugins through entry points and call their hook, isolating each broken one.

pluggy's ``load_setuptools_entrypoints`` stops at the first plugin that fails to import; here every
entry point is loaded, registered and called on its own, so one broken third-party package is
recorded (and shown by ``mqa explain``) while every other provider keeps working.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import pluggy

from . import hookspecs
from .errors import PluginError
from .settings import Settings
from .spec import ProviderSpec

log = logging.getLogger("mqa_core")


@dataclass(frozen=True)
class BrokenPlugin:
    """A plugin that could not contribute providers, and why."""

    entry_point: str
    distribution: str
    version: str
    stage: str  # import | register | hook | spec | duplicate
    error: str

    def __str__(self) -> str:
        origin = f"{self.distribution}=={self.version}" if self.distribution else "?"
        return f"plugin {self.entry_point!r} ({origin}) is broken at {self.stage}: {self.error}"


@dataclass(frozen=True)
class Discovery:
    """What discovery found: valid specs in a deterministic order, and the broken plugins."""

    specs: tuple[ProviderSpec, ...]
    broken: tuple[BrokenPlugin, ...]
    skipped: tuple[str, ...]  # entry points not loaded because MQA_PLUGINS left them out


def _dist(ep: Any) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "", ""
    return dist.metadata["Name"] or "", dist.version or ""


def _entry_points() -> list[Any]:
    found = md.entry_points(group=hookspecs.ENTRY_POINT_GROUP)
    # Sorted, and deduplicated (a dist on sys.path twice lists twice), so that every process and
    # every rank discovers the same plugins in the same order.
    unique = {(ep.name, ep.value, *_dist(ep)): ep for ep in found}
    return [unique[k] for k in sorted(unique)]


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def discover(settings: Settings, entry_points: Iterable[Any] | None = None) -> Discovery:
    """Load the plugins allowed by ``settings`` and collect their specs."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    specs: dict[str, ProviderSpec] = {}
    broken: list[BrokenPlugin] = []
    skipped: list[str] = []
    for ep in _entry_points() if entry_points is None else entry_points:
        dist, version = _dist(ep)

        def fail(stage: str, error: str) -> None:
            broken.append(BrokenPlugin(ep.name, dist, version, stage, error))

        if settings.plugins is not None and ep.name not in settings.plugins:
            skipped.append(ep.name)
            continue
        try:
            plugin = ep.load()
        except BaseException as exc:  # a plugin's import may raise anything, SystemExit included
            if isinstance(exc, KeyboardInterrupt):
                raise
            fail("import", _error(exc))
            continue
        try:
            pm.register(plugin, name=f"{ep.name}:{dist}")
        except Exception as exc:
            fail("register", _error(exc))
            continue
        impls = [i for i in pm.hook.mqa_providers.get_hookimpls() if i.plugin is plugin]
        if not impls:
            fail("hook", "defines no @mqa_core.hookimpl mqa_providers()")
            continue
        for impl in impls:
            try:
                returned = impl.function()
                if not isinstance(returned, (list, tuple)):
                    raise TypeError(f"mqa_providers() returned {type(returned).__name__}, "
                                    "expected a list of ProviderSpec")
            except Exception as exc:
                fail("hook", _error(exc))
                continue
            for spec in returned:
                if not isinstance(spec, ProviderSpec):
                    fail("spec", f"returned {type(spec).__name__} {spec!r:.80}, not a ProviderSpec")
                    continue
                if spec.name in specs:
                    taken = specs[spec.name]
                    fail("duplicate", f"provider name {spec.name!r} is already taken by "
                                      f"{taken.distribution or '?'}=={taken.version or '?'}")
                    continue
                specs[spec.name] = replace(spec, distribution=spec.distribution or dist,
                                           version=spec.version or version)
    for b in broken:
        if settings.strict:
            raise PluginError(f"{b} (MQA_STRICT_PLUGINS=1)")
        log.warning("%s; its providers are ignored", b)
        warnings.warn(f"mqa_core: {b}; its providers are ignored", RuntimeWarning, stacklevel=3)
    return Discovery(tuple(specs[k] for k in sorted(specs)), tuple(broken), tuple(skipped))
