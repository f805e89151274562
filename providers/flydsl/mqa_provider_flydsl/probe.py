"""Is AMD's AITER, with the FlyDSL MQA-logits kernel, usable for an arch? Cheap, cached, never raises.

Two pitfalls shape the order of the questions. The import name ``aiter`` is shared by AMD's AITER
(distribution ``amd-aiter``) and an unrelated async-iterator package on PyPI (distribution ``aiter``),
so the package on disk is inspected before anything runs. And importing AMD's AITER is slow and
raises on a machine without ROCm, so metadata answers what it can (which package, which version)
and the import happens at most once per discovery, its result cached.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as md
import importlib.util
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The archs AITER builds the kernel for.
ARCHS = ("gfx942", "gfx950")
#: AMD's distribution; older source builds were also published under the import name.
AMD_DIST = "amd-aiter"
OTHER_DIST = "aiter"
ENTRY = "aiter.ops.flydsl.flydsl_fp8_mqa_logits"
#: The gfx950 FlyDSL path (CDNA4 scaled-MFMA variants) landed in ROCm/aiter#4538, released in v0.1.23.
GFX950_MIN = (0, 1, 23)
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


_PEP440 = re.compile(
    r"""^\s*v?(?:\d+!)?(?P<release>\d+(?:\.\d+)*)
    (?P<pre>[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?\d*)?
    (?P<post>-\d+|[-_.]?(?:post|rev|r)[-_.]?\d*)?
    (?P<dev>[-_.]?dev[-_.]?\d*)?
    (?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?\s*$""",
    re.VERBOSE | re.IGNORECASE,
)


def at_least(version: str, minimum: tuple[int, ...]) -> bool | None:
    """PEP 440 ``version >= minimum`` for a release ``minimum``; None if ``version`` is unreadable.

    A pre-release or dev build of the minimum itself (``0.1.23rc1``, ``0.1.23.dev5+g...``, what
    setuptools_scm names commits after the previous tag) sorts before it, so it does not qualify.
    Written here because ``packaging`` is not a dependency of this provider.
    """
    m = _PEP440.match(version)
    if m is None:
        return None
    release = tuple(int(p) for p in m["release"].split("."))
    width = max(len(release), len(minimum))
    have = release + (0,) * (width - len(release))
    need = minimum + (0,) * (width - len(minimum))
    if have != need:
        return have > need
    return not (m["pre"] or (m["dev"] and not m["post"]))


def gfx950_reason(found: Installed) -> str | None:
    """Why this AITER cannot run the kernel on gfx950 (too old, or version unknown), else None."""
    need = ".".join(map(str, GFX950_MIN))
    why = f"gfx950 needs {AMD_DIST} >= {need} (the gfx950 FlyDSL MQA-logits path, ROCm/aiter#4538)"
    if found.version is None:
        return (f"cannot tell the AMD AITER version at {found.location} (no {AMD_DIST} distribution "
                f"metadata); {why}")
    ok = at_least(found.version, GFX950_MIN)
    if ok is None:
        return f"cannot read AMD AITER version {found.version!r}; {why}"
    if not ok:
        return f"{AMD_DIST} {found.version} is too old for gfx950: {why}; gfx942 is served"
    return None


KernelFn = Callable[..., Any]


@functools.lru_cache(maxsize=1)
def load_entry() -> tuple[KernelFn | None, str | None]:
    """Import AITER once: ``(flydsl_fp8_mqa_logits, None)`` or ``(None, why not)``."""
    version = installed().version
    name = f"AMD AITER {version}" if version else "AMD AITER"
    try:
        importlib.import_module("aiter")
    except (Exception, SystemExit) as exc:  # without ROCm it raises RuntimeError, OSError, ...
        return None, f"AMD AITER not importable: {_err(exc)}"
    try:
        module = importlib.import_module("aiter.ops.flydsl")
    except (Exception, SystemExit) as exc:  # e.g. the 'flydsl' compiler package missing or too old
        return None, f"{name} imports, but aiter.ops.flydsl does not: {_err(exc)}"
    try:
        fn = module.flydsl_fp8_mqa_logits  # a lazy attribute: imports the kernel module
    except AttributeError:
        return None, f"{name} has no {ENTRY} (added in ROCm/aiter#3913); upgrade {AMD_DIST}"
    except (Exception, SystemExit) as exc:
        return None, f"{name}: importing {ENTRY} failed: {_err(exc)}"
    if not callable(fn):
        return None, f"{name}: {ENTRY} is a {type(fn).__name__}, not a function"
    return fn, None


@functools.cache
def _check(arch: str) -> str | None:
    if arch not in ARCHS:
        return f"AITER's FlyDSL MQA-logits kernel is built for {', '.join(ARCHS)}, not {arch}"
    found = installed()
    if found.problem:
        return found.problem
    if arch == "gfx950":
        reason = gfx950_reason(found)
        if reason:
            return reason
    return load_entry()[1]


def check(arch: str) -> str | None:
    """The spec's runtime check: None when AITER can run the kernel for ``arch``, else why not.

    Answers for what is installed, never for the local device, so ``mqa explain --arch gfx950``
    on any machine tells whether this environment would serve gfx950.
    """
    try:
        return _check(arch)
    except Exception as exc:  # a check must never take the process down
        return f"flydsl runtime check failed: {_err(exc)}"


def reset() -> None:
    """Forget cached answers (called at each discovery, so ``mqa_core.reload()`` re-probes)."""
    importlib.invalidate_caches()
    installed.cache_clear()
    load_entry.cache_clear()
    _check.cache_clear()
