"""Is AMD's AITER, with the FlyDSL MQA-logits kernel, usable for an arch? Cheap, cached, never raises.

Three pitfalls shape the order of the questions. The import name ``aiter`` is shared by AMD's AITER
(distribution ``amd-aiter``) and an unrelated async-iterator package on PyPI (distribution ``aiter``),
so the package on disk is inspected before anything runs. Importing AMD's AITER is slow and raises on
a machine without ROCm, so the files answer what they can and the import happens at most once per
discovery. And AITER exports the entry only when the separate ``flydsl`` compiler package imports, so
a missing ``flydsl`` must be named as such, not read as "this AITER is too old".

What each ROCm/aiter version does, as read from its source (never copied):

- The entry ``aiter.ops.flydsl.flydsl_fp8_mqa_logits`` came with ROCm/aiter#3913 (``0571aeac7b``,
  2026-07-07); the first tag holding it is v0.1.18 (``d6de77692f``; v0.1.17 has none).
- v0.1.18 to v0.1.20.post1 (``de07f3885e``) export it from ``aiter/ops/flydsl/__init__.py`` only
  ``if is_flydsl_available()`` (line 23), which is ``find_spec("flydsl")`` and the GPU's arch in
  flydsl's ``SMEM_CAPACITY_MAP`` (``aiter/ops/flydsl/utils.py`` lines 72-82): without ``flydsl``,
  ``import aiter.ops.flydsl`` works and the entry is simply absent. With flydsl older than 0.2.4 the
  import raises ImportError (``_MIN_FLYDSL_VERSION``, lines 16-38).
- A later layout (``aiter/ops/flydsl/fp8_mqa_logits_kernels.py`` holding the entry) imports
  ``flydsl`` unconditionally in ``aiter/ops/flydsl/__init__.py`` and resolves the entry lazily:
  without ``flydsl`` the package import raises ModuleNotFoundError.
- Those releases are gfx942-only ("FlyDSL gfx942 FP8 MQA logits"; AITER's test runs only on
  gfx942, ``SUPPORTED_GFX``), and never name gfx950. The gfx950 path is ROCm/aiter#4538 (open at its
  last stored comment, 2026-09-16); a build carrying it branches on ``_ARCH == "gfx950"`` in the
  module that defines the entry. No release tag read here carries it, so gfx950 is judged by that
  marker in the installed entry's source, not by a version number.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as md
import importlib.util
import inspect
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["ARCHS", "ENTRY", "FLYDSL_MIN", "Installed", "check", "entry_source", "gfx950_reason",
           "flydsl_installed", "guarded", "installed", "load_entry", "needs_flydsl", "ready", "reset"]

#: The archs AITER builds the kernel for.
ARCHS = ("gfx942", "gfx950")
#: AMD's distribution; older source builds were also published under the import name.
AMD_DIST = "amd-aiter"
OTHER_DIST = "aiter"
FLYDSL = "flydsl"
#: ``_MIN_FLYDSL_VERSION`` of every AITER release with the entry (v0.1.18 to v0.1.20.post1).
FLYDSL_MIN = "0.2.4"
ENTRY = "aiter.ops.flydsl.flydsl_fp8_mqa_logits"
#: Where each layout defines the entry, relative to the ``aiter`` package, newest first.
ENTRY_FILES = (
    "ops/flydsl/fp8_mqa_logits_kernels.py",  # the later layout with the gfx950 path
    "ops/flydsl/kernels/mqa_logits/fp8_mqa_logits.py",  # v0.1.20, v0.1.20.post1
    "ops/flydsl/kernels/fp8_mqa_logits.py",  # v0.1.18, v0.1.19
)
#: The gfx950 path branches on the arch name in the entry's module; gfx942-only builds never name it.
_GFX950_MARK = re.compile(r"""["']gfx950["']""")
_INSTALL = f"install AMD's {AMD_DIST} (shipped with ROCm builds; not the PyPI package 'aiter')"


@dataclass(frozen=True)
class Installed:
    """What the environment holds under the import name ``aiter``, learned without importing it."""

    #: Why it cannot be AMD's AITER, or None when it may be.
    problem: str | None
    #: ``amd-aiter`` (or an AMD build named ``aiter``) version from metadata, if any.
    version: str | None = None
    #: Where ``aiter`` would be imported from, for messages.
    location: str = ""

    @property
    def name(self) -> str:
        return f"{AMD_DIST} {self.version}" if self.version else "AMD AITER"


def _err(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _amd_layout(spec: Any) -> bool | None:
    """True if the package has AMD's ``aiter/ops`` subpackage, False if not, None if undecidable."""
    places = list(spec.submodule_search_locations or ())
    if not places:  # a single-module ``aiter.py``: not AMD's package
        return False if spec.origin and os.path.isfile(spec.origin) else None
    dirs = [p for p in places if os.path.isdir(p)]
    if not dirs:  # zip or custom loader: let the import decide
        return None
    return any(os.path.isdir(os.path.join(p, "ops")) for p in dirs)


@functools.lru_cache(maxsize=1)
def installed() -> Installed:
    """Which ``aiter`` is importable and which distribution it comes from; imports nothing."""
    amd, other = _dist_version(AMD_DIST), _dist_version(OTHER_DIST)
    both = (f" (both {AMD_DIST} {amd} and {OTHER_DIST} {other} are installed and share the import "
            f"name; pip uninstall {OTHER_DIST})") if amd and other else ""
    try:
        spec = importlib.util.find_spec("aiter")
    except Exception as exc:
        return Installed(f"AMD AITER not importable: {_err(exc)}")
    if spec is None:
        return Installed(f"AMD AITER not importable: no module named 'aiter'; {_INSTALL}")
    location = next(iter(spec.submodule_search_locations or ()), None) or spec.origin or "?"
    amd_layout = _amd_layout(spec)
    if amd_layout is False:
        what = (f"the unrelated async-iterator package (distribution {OTHER_DIST} {other})" if other
                else f"not AMD's AITER (no aiter.ops under {location})")
        return Installed(f"the installed 'aiter' is {what}; install AMD's {AMD_DIST}{both}", None,
                         location)
    # An AMD-shaped package: amd-aiter's metadata gives the version; old AMD builds named 'aiter'.
    return Installed(None, amd or other, location)


def needs_flydsl(found: Installed) -> str:
    """The reason given when AITER is here and ``flydsl`` is not: no AITER exports the entry then."""
    return (f"AMD AITER's FlyDSL entry needs the `{FLYDSL}` package, which is not installed: "
            f"{found.name} exports {ENTRY} only when `{FLYDSL}` imports (install the {FLYDSL} "
            f"build your AITER pins, >= {FLYDSL_MIN})")


def flydsl_installed() -> bool:
    """Whether the ``flydsl`` package can be imported; found without importing it.

    A directory named ``flydsl`` without ``__init__.py`` on ``sys.path`` (a checkout's tests, say) is
    an implicit namespace package, not the compiler: it does not count.
    """
    try:
        spec = importlib.util.find_spec(FLYDSL)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


def _flydsl_missing(exc: BaseException) -> bool:
    """The package itself is absent (a broken install, missing one of its parts, is reported as is)."""
    return isinstance(exc, ModuleNotFoundError) and exc.name == FLYDSL


def entry_source(location: str) -> tuple[str, str] | None:
    """``(path, text)`` of the file that defines the entry in the package at ``location``, if any."""
    for rel in ENTRY_FILES:
        path = os.path.join(location, *rel.split("/"))
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        if "def flydsl_fp8_mqa_logits" in text:
            return path, text
    return None


def gfx950_reason(found: Installed, source: tuple[str, str] | None) -> str | None:
    """Why this AITER's entry has no gfx950 path, judged from its source, else None."""
    if source is None:
        return (f"cannot tell whether {found.name} has the gfx950 FlyDSL MQA-logits path "
                f"(ROCm/aiter#4538): no source of {ENTRY} under {found.location}; gfx942 is served")
    path, text = source
    if _GFX950_MARK.search(text):
        return None
    return (f"{found.name}'s FlyDSL MQA-logits entry ({path}) is gfx942-only (ROCm/aiter#3913, "
            f"as released in v0.1.18 to v0.1.20.post1); gfx950 needs the gfx950 path of "
            f"ROCm/aiter#4538; gfx942 is served")


def _loaded_source(fn: Callable[..., Any]) -> tuple[str, str] | None:
    try:
        path = inspect.getsourcefile(fn)
        if path is None:
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            return path, f.read()
    except (OSError, TypeError):
        return None


def _absent_entry_reason(found: Installed, module: Any) -> str:
    """Why ``aiter.ops.flydsl`` imported without the entry: no flydsl, flydsl off here, or too old."""
    if not flydsl_installed():
        return needs_flydsl(found)
    available = getattr(module, "is_flydsl_available", None)
    if callable(available):
        try:
            ok, why = bool(available()), ""
        except Exception as exc:  # it asks flydsl for the GPU's arch, which may fail here
            ok, why = False, f": {_err(exc)}"
        if not ok:
            return (f"{found.name} exports {ENTRY} only when aiter.ops.flydsl.is_flydsl_available() "
                    f"is true, and here it is not (`{FLYDSL}` does not support this machine's GPU"
                    f"{why})")
    return (f"{found.name} has no {ENTRY} (added in ROCm/aiter#3913, first released in v0.1.18); "
            f"upgrade {AMD_DIST}")


KernelFn = Callable[..., Any]


@functools.lru_cache(maxsize=1)
def load_entry() -> tuple[KernelFn | None, str | None]:
    """Import AITER once: ``(flydsl_fp8_mqa_logits, None)`` or ``(None, why not)``."""
    found = installed()
    try:
        importlib.import_module("aiter")
    except (Exception, SystemExit) as exc:  # without ROCm it raises RuntimeError, OSError, ...
        return None, f"AMD AITER not importable: {_err(exc)}"
    try:
        module = importlib.import_module("aiter.ops.flydsl")
    except (Exception, SystemExit) as exc:  # flydsl missing or too old, ...
        if _flydsl_missing(exc):
            return None, needs_flydsl(found)
        return None, f"{found.name} imports, but aiter.ops.flydsl does not: {_err(exc)}"
    try:
        fn = module.flydsl_fp8_mqa_logits  # an attribute, or a lazy one that imports the kernel
    except AttributeError:
        return None, _absent_entry_reason(found, module)
    except (Exception, SystemExit) as exc:
        if _flydsl_missing(exc):
            return None, needs_flydsl(found)
        return None, f"{found.name}: importing {ENTRY} failed: {_err(exc)}"
    if not callable(fn):
        return None, f"{found.name}: {ENTRY} is a {type(fn).__name__}, not a function"
    return fn, None


@functools.cache
def _check(arch: str) -> str | None:
    if arch not in ARCHS:
        return f"AITER's FlyDSL MQA-logits kernel is built for {', '.join(ARCHS)}, not {arch}"
    found = installed()
    if found.problem:
        return found.problem
    source = entry_source(found.location)
    if arch == "gfx950" and source is not None:  # decided from the files, before any import
        reason = gfx950_reason(found, source)
        if reason:
            return reason
    if not flydsl_installed():  # every layout's entry module imports flydsl
        return needs_flydsl(found)
    fn, why = load_entry()
    if fn is None:
        return why
    if arch == "gfx950" and source is None:  # installed without sources on disk where expected
        return gfx950_reason(found, _loaded_source(fn))
    return None


def check(arch: str) -> str | None:
    """The spec's runtime check: None when AITER can run the kernel for ``arch``, else why not.

    Answers for what is installed, never for the local device, so ``mqa explain --arch gfx950``
    on any machine tells whether this environment would serve gfx950.
    """
    return guarded("flydsl", _check, arch)


def guarded(name: str, check_: Callable[[str], str | None], arch: str) -> str | None:
    """``check_(arch)``, or why it raised: a provider's check must never take the process down.
    Shared by the ``flydsl`` and ``aiter`` providers' checks (``name`` says whose)."""
    try:
        return check_(arch)
    except Exception as exc:
        return f"{name} runtime check failed: {_err(exc)}"


_T = TypeVar("_T")


def ready(name: str, arch: str, device: Any, claim: str, archs: tuple[str, ...],
          check_: Callable[[str], str | None], load: Callable[[], tuple[_T | None, str | None]]) -> _T:
    """What an adapter runs before a launch on ``device`` (of ``arch``): ``load()``'s entry, or a
    RuntimeError that says why not: ``arch`` outside ``archs`` (``claim`` says what the provider
    declares), ``check_(arch)``'s reason, or the load's. Shared by both providers' kernel objects."""
    if arch not in archs:
        raise RuntimeError(f"{name}: {claim}; the tensors are on {device} ({arch})")
    reason = check_(arch)
    if reason:
        raise RuntimeError(f"{name} cannot run on {arch}: {reason}")
    entry, why = load()
    if entry is None:  # unreachable after a passing check, kept for a clear message
        raise RuntimeError(f"{name} cannot run on {arch}: {why}")
    return entry


def reset() -> None:
    """Forget cached answers (called at each discovery, so ``mqa_core.reload()`` re-probes)."""
    importlib.invalidate_caches()
    installed.cache_clear()
    load_entry.cache_clear()
    _check.cache_clear()

