"""Find provider plugins through entry points and call their hook, isolating each broken one.

pluggy's ``load_setuptools_entrypoints`` stops at the first plugin that fails to import; here every
entry point is loaded, registered and called on its own, so one broken third-party package is
recorded (and shown by ``mqa explain``) while every other provider keeps working.

Trust boundaries (see docs/hooks.md):
- every call into plugin code (the import, pluggy's registration, the hook) may raise anything,
  ``SystemExit`` included; it is recorded as that plugin's failure. Only ``KeyboardInterrupt``
  propagates: it is the user's, not the plugin's;
- a plugin is valid as a whole or not at all: one bad item in what its hook returns and none of its
  specs are used;
- ``MQA_PLUGINS`` is decided before any import: an entry point it leaves out is never imported; it
  names distributions (unique in an environment), never bare entry-point names (anyone's to choose);
- a distribution installed twice on ``sys.path`` (two dist-info directories whose names normalise
  alike) whose copies differ (version, or what an entry point names) is never imported:
  ``importlib.metadata`` shows only the first, so which code served would depend on path order.
  Both are reported as broken (stage ``shadowed``) until one is removed;
- a spec's distribution and version are the installed distribution's, never what the plugin says.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import pluggy

from . import hookspecs
from .errors import PluginError
from .names import (
    names_plugin,
    names_provider,
    names_provider_or_distribution,
    normalize_distribution,
    printable,
    provider_id,
)
from .settings import Settings
from .spec import COMPOSED_DISTRIBUTION, COMPOSED_NAME, ProviderSpec, plain_spec

log = logging.getLogger("mqa_core")

#: A plugin whose import takes longer than this is warned about (every caller waits for discovery).
SLOW_IMPORT_S = 1.0


@dataclass(frozen=True)
class BrokenPlugin:
    """A plugin that could not contribute providers, and why."""

    entry_point: str
    distribution: str
    version: str
    stage: str  # import | register | hook | spec | duplicate | shadowed
    error: str
    import_seconds: float | None = None

    def __str__(self) -> str:
        origin = f"{self.distribution}=={self.version}" if self.distribution else "?"
        return f"plugin {self.entry_point!r} ({origin}) is broken at {self.stage}: {self.error}"


@dataclass(frozen=True)
class PluginInfo:
    """One entry point of the group and what became of it."""

    entry_point: str
    value: str
    distribution: str
    version: str
    status: str  # loaded | skipped | broken
    #: Seconds its import took; None when it was not imported.
    import_seconds: float | None = None
    #: Names of the providers it contributed.
    providers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Discovery:
    """What discovery found: valid specs in a deterministic order, and the broken plugins."""

    specs: tuple[ProviderSpec, ...]
    broken: tuple[BrokenPlugin, ...]
    skipped: tuple[str, ...]  # entry points not loaded because MQA_PLUGINS left them out
    #: Every entry point seen, loaded or not, in discovery order.
    plugins: tuple[PluginInfo, ...] = ()

    def import_seconds(self) -> dict[str, float]:
        """Spec id -> seconds its plugin's import took."""
        out: dict[str, float] = {}
        for p in self.plugins:
            if p.import_seconds is not None:
                for name in p.providers:
                    out[provider_id(p.distribution, name)] = p.import_seconds
        return out


def _dist(ep: Any) -> tuple[str, str]:
    """The entry point's distribution name and version, as printable text (they are the plugin's)."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "", ""
    return printable(dist.metadata["Name"] or ""), printable(dist.version or "")


def _where(dist: Any) -> str:
    """Where a distribution's metadata lives (symlinks resolved), to tell two copies apart."""
    path = getattr(dist, "_path", None)
    try:
        return os.path.realpath(str(path if path is not None else dist.locate_file("")))
    except Exception:  # a custom finder's distribution: its identity is all there is
        return f"<{type(dist).__name__} {id(dist):#x}>"


def _normalized(dist: Any) -> str:
    name = getattr(dist, "_normalized_name", None)  # from the directory name: no METADATA read
    return normalize_distribution(name if isinstance(name, str) and name else (dist.metadata["Name"] or ""))


#: A distribution found more than once on sys.path: normalised name -> [(where, version), ...].
Shadows = dict[str, list[tuple[str, str]]]


def _entry_points() -> tuple[list[Any], Shadows]:
    """Every entry point of the group from every distribution on ``sys.path`` (``md.entry_points``
    keeps only the first distribution of a name and so hides a second one), and the distributions of
    the group found more than once."""
    named: dict[str, list[Any]] = {}
    for dist in md.distributions():
        named.setdefault(_normalized(dist), []).append(dist)
    found: list[Any] = []
    shadows: Shadows = {}
    for name, dists in named.items():
        eps = [[ep for ep in d.entry_points if ep.group == hookspecs.ENTRY_POINT_GROUP] for d in dists]
        if not any(eps):
            continue
        if len(dists) > 1:
            # Copies that say the same (version, and each entry point naming the same object) import
            # the same code whichever comes first: they count as one, as importlib.metadata would
            # (the same directory on sys.path twice, or an editable install's egg-info in its source
            # tree beside its dist-info). Copies that differ are shadows: reported, none imported.
            first: dict[Any, tuple[Any, list[Any]]] = {}
            for d, e in zip(dists, eps):
                first.setdefault((d.version, tuple(sorted((ep.name, ep.value) for ep in e))), (d, e))
            if len(first) == 1:
                eps = eps[:1]
            else:
                shadows[name] = sorted((_where(d), d.version or "?") for d, _ in first.values())
                eps = [e for _, e in first.values()]
        found += [ep for e in eps for ep in e]
    # Sorted, so that every process and every rank discovers the same plugins in the same order.
    found.sort(key=lambda ep: (ep.name, ep.value, *_dist(ep), _where(ep.dist) if getattr(ep, "dist", None) else ""))
    return found, shadows


def _shadowed_text(name: str, copies: list[tuple[str, str]]) -> str:
    where = "; ".join(f"{version} at {path}" for path, version in copies)
    return (f"distribution {name} is installed {len(copies)} times on sys.path ({where}): which one's code "
            "would serve depends on path order, so neither is imported or chosen until one is removed "
            "(pip uninstall, or fix sys.path)")


def describe_error(exc: BaseException) -> str:
    """``"Type: message"`` as one printable line (:func:`mqa_core.names.printable`); safe against an
    exception whose ``str()`` itself raises."""
    try:
        text = printable(str(exc))
    except KeyboardInterrupt:
        raise
    except BaseException:
        text = "<str() of the exception raised>"
    return f"{printable(type(exc).__name__)}: {text}"


class _Failed(Exception):
    def __init__(self, stage: str, error: str) -> None:
        super().__init__(error)
        self.stage, self.error = stage, error


def _collect(pm: pluggy.PluginManager, plugin: Any, ep: Any, dist: str, version: str) -> list[ProviderSpec]:
    """The plugin's specs, all of them valid, or :class:`_Failed` for the whole plugin."""
    try:
        pm.register(plugin, name=f"{ep.name}:{dist}")
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise _Failed("register", describe_error(exc)) from None
    impls = [i for i in pm.hook.mqa_providers.get_hookimpls() if i.plugin is plugin]
    if not impls:
        raise _Failed("hook", "defines no @mqa_core.hookimpl mqa_providers()")
    specs: list[ProviderSpec] = []
    for impl in impls:
        try:
            returned = impl.function()
            if not isinstance(returned, (list, tuple)):
                raise TypeError(f"mqa_providers() returned {type(returned).__name__}, "
                                "expected a list of ProviderSpec")
            items = list(returned)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            raise _Failed("hook", describe_error(exc)) from None
        for spec in items:
            if type(spec) is not ProviderSpec:
                raise _Failed("spec", f"returned {type(spec).__name__}, not a ProviderSpec; "
                                      "a plugin is used whole or not at all")
            try:  # builtins of exactly the declared types, before anything hashes or compares them
                specs.append(plain_spec(spec))
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                raise _Failed("spec", describe_error(exc)) from None
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise _Failed("spec", f"returns more than one provider named {', '.join(twice)}")
    out = []
    for spec in specs:
        if spec.distribution and dist and normalize_distribution(spec.distribution) != normalize_distribution(dist):
            raise _Failed("spec", f"provider {spec.name!r} says it comes from {spec.distribution!r}, but "
                                  f"{dist}=={version} installed it")
        try:  # replace() validates again; the description is shown by the CLI: printable
            out.append(replace(spec, distribution=dist or spec.distribution, version=version or spec.version,
                               description=printable(spec.description)))
        except ValueError as exc:
            raise _Failed("spec", str(exc)) from None
    return out


def _watch_slow_import(ep: Any, dist: str) -> threading.Timer:
    """Log while an import is still running after :data:`SLOW_IMPORT_S`: the hint a hang needs."""
    def still_running() -> None:
        log.warning("mqa_core: importing plugin %r (%s) has taken over %.0f s and is still running; every "
                    "mqa_core caller waits for discovery (leave it out with MQA_PLUGINS)",
                    ep.name, dist or "?", SLOW_IMPORT_S)

    timer = threading.Timer(SLOW_IMPORT_S, still_running)
    timer.daemon = True
    timer.start()
    return timer


def _module_of(value: str) -> str:
    return value.partition(":")[0].strip()


def cut_by_fork(module: str, cut: Iterable[str]) -> str | None:
    """Why ``module`` must not be imported in this process: it is, holds or belongs to a module whose
    import a fork cut off (see registry), so importing it would hang; None when it may be imported."""
    if any(module == m or module.startswith(m + ".") or m.startswith(module + ".") for m in cut):
        return (f"{module} was being imported by another thread when this process forked; importing it "
                "again here would hang (it loads in a fresh process)")
    return None


def discover(settings: Settings, entry_points: Iterable[Any] | None = None, *,
             forbidden: frozenset[str] = frozenset(), inflight: set[str] | None = None) -> Discovery:
    """Load the plugins allowed by ``settings`` and collect their specs.

    :param forbidden: modules never to import (their import was cut off by a fork; see registry).
    :param inflight: a set this adds a module to while importing it, so that a fork can tell.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    specs: dict[str, ProviderSpec] = {}
    broken: list[BrokenPlugin] = []
    skipped: list[str] = []
    plugins: list[PluginInfo] = []
    if entry_points is None:
        eps, shadows = _entry_points()
    else:
        eps, shadows = list(entry_points), {}
    for ep in eps:
        dist, version = _dist(ep)
        name = printable(ep.name)  # the entry point's name and value are the plugin's text too

        def record(status: str, seconds: float | None, provided: tuple[str, ...] = ()) -> None:
            plugins.append(PluginInfo(name, printable(ep.value), dist, version, status, seconds, provided))

        def fail(stage: str, error: str, seconds: float | None) -> None:
            broken.append(BrokenPlugin(name, dist, version, stage, printable(error), seconds))
            record("broken", seconds)

        if settings.plugins is not None and not any(names_plugin(r, name, dist) for r in settings.plugins):
            skipped.append(name)
            record("skipped", None)
            continue
        if dist and normalize_distribution(dist) in shadows:
            fail("shadowed", _shadowed_text(normalize_distribution(dist), shadows[normalize_distribution(dist)]), None)
            continue
        module = _module_of(ep.value)
        cut = cut_by_fork(module, forbidden)
        if cut:
            fail("import", cut, None)
            continue
        t0 = time.perf_counter()
        watch = _watch_slow_import(ep, dist)
        if inflight is not None:
            inflight.add(module)
        try:
            plugin = ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a plugin's import may raise anything, SystemExit included
            fail("import", describe_error(exc), time.perf_counter() - t0)
            continue
        finally:
            watch.cancel()
            if inflight is not None:
                inflight.discard(module)
        seconds = time.perf_counter() - t0
        if seconds > SLOW_IMPORT_S:
            msg = (f"mqa_core: importing plugin {ep.name!r} ({dist or '?'}) took {seconds:.1f} s; every "
                   f"caller waits for discovery (leave it out with MQA_PLUGINS)")
            log.warning(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
        try:
            found = _collect(pm, plugin, ep, dist, version)
        except _Failed as exc:
            fail(exc.stage, exc.error, seconds)
            continue
        taken = [s for s in found if s.id in specs]
        if taken:
            fail("duplicate", f"{dist or '?'} already registered provider "
                              f"{', '.join(repr(s.name) for s in taken)} through another entry point", seconds)
            continue
        for spec in found:
            specs[spec.id] = spec
        record("loaded", seconds, tuple(s.name for s in found))
    for b in broken:
        if settings.strict:
            raise PluginError(f"{b} (MQA_STRICT_PLUGINS is on)")
        log.warning("%s; its providers are ignored", b)
        warnings.warn(f"mqa_core: {b}; its providers are ignored", RuntimeWarning, stacklevel=3)
    ordered = sorted(specs.values(), key=lambda s: (s.name, normalize_distribution(s.distribution)))
    return Discovery(tuple(ordered), tuple(broken), tuple(skipped), tuple(plugins))


def unknown_names(settings: Settings, found: Discovery) -> list[str]:
    """One message per ``MQA_*`` list entry that names nothing installed (a typo fails open)."""
    installed = ", ".join(f"{s.name} ({s.distribution or '?'})" for s in found.specs) or "none"
    plugins = ", ".join(f"{p.distribution or '?'}:{p.entry_point}" for p in found.plugins) or "none"
    dists = {normalize_distribution(p.distribution) for p in found.plugins if p.distribution}
    out = []
    # The core's composed provider is no plugin, but MQA_PROVIDER and MQA_DISABLE_PROVIDERS may name it.
    core = (COMPOSED_DISTRIBUTION, COMPOSED_NAME)
    missing = [r for r in settings.preference
               if not any(names_provider(r, d, n) for d, n in [*((s.distribution, s.name) for s in found.specs), core])]
    if missing:
        out.append(f"MQA_PROVIDER names {', '.join(missing)}, which no installed provider is "
                   f"(installed: {installed})")
    missing = [r for r in sorted(settings.disabled)
               if not any(names_provider_or_distribution(r, d, n)
                          for d, n in [*((s.distribution, s.name) for s in found.specs), core])
               and not (":" not in r and normalize_distribution(r) in dists)]
    if missing:
        out.append(f"MQA_DISABLE_PROVIDERS names {', '.join(missing)}, which matches no installed provider "
                   f"or distribution, so it blocks nothing (installed: {installed})")
    if settings.plugins is not None:
        missing = [r for r in sorted(settings.plugins)
                   if not any(names_plugin(r, p.entry_point, p.distribution) for p in found.plugins)]
        if missing:
            out.append(f"MQA_PLUGINS names {', '.join(missing)}, which matches no installed plugin "
                       f"distribution (MQA_PLUGINS takes distribution or distribution:entry_point; "
                       f"installed: {plugins})")
    return out
