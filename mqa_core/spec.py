"""What a provider declares about itself: :class:`ProviderSpec` and the :class:`Problem` it is judged on.

A spec is pure data plus two optional callables (a runtime check and shape limits). It names its
kernel object by a ``"module:attr"`` string so that listing and selecting providers never imports a
kernel library (triton, aiter); the object is imported only once the provider is chosen.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .arch import ANY_ARCH, KNOWN_ARCHS

#: The ops a provider can serve. Each is a method of the same name on the loaded kernel object.
OPS = ("fp8_mqa_logits", "fp8_paged_mqa_logits")
#: fp8 flavours a provider can accept for q and k.
DTYPES = ("float8_e4m3fn", "float8_e4m3fnuz")

_NAME = re.compile(r"^[a-z][a-z0-9_\-]*$")
_LOAD = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass(frozen=True)
class Problem:
    """The sizes a call has, for shape limits: M queries, N keys, H heads, head dim D.

    For the paged op, ``m`` is batch * next_n and ``n`` is max_context_len.
    """

    m: int
    n: int
    h: int
    d: int

    def __post_init__(self) -> None:
        for k in ("m", "n", "h", "d"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"Problem.{k} must be a non-negative int, got {v!r}")

    @classmethod
    def parse(cls, text: str) -> "Problem":
        """``"M,N,H,D"`` -> Problem; the CLI's ``--shape``."""
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 4 or not all(p.isdigit() for p in parts):
            raise ValueError(f"shape must be M,N,H,D as four non-negative integers, got {text!r}")
        m, n, h, d = (int(p) for p in parts)
        return cls(m, n, h, d)

    def __str__(self) -> str:
        return f"M={self.m},N={self.n},H={self.h},D={self.d}"


#: A runtime check: given the arch asked for, None when usable, else the reason it is not.
RuntimeCheck = Callable[[str], str | None]
#: Shape limits: given a problem, None when supported, else the reason it is not.
ShapeLimits = Callable[[Problem], str | None]


@dataclass(frozen=True)
class ProviderSpec:
    """A provider's capability, priority and lazy kernel, as returned by the ``mqa_providers`` hook.

    :param name: unique, lower case; what ``MQA_PROVIDER`` and ``MQA_DISABLE_PROVIDERS`` name.
    :param ops: the ops served, from :data:`OPS`.
    :param archs: arch names it is written for (``sm_90``, ``gfx950``, ``cpu``...), or ``"any"``.
    :param dtypes: fp8 flavours accepted for q and k, from :data:`DTYPES`.
    :param priority: higher wins; ties break by name. In use: flydsl 300, gluon 200, torch_ref 0.
    :param load: ``"module:attr"`` of the kernel object, imported only when chosen. The object has
        one method per op in ``ops``, with the op's signature.
    :param check: optional runtime check ``check(arch) -> None | reason``; must not raise or be slow.
        For an explicit arch it answers for what is installed here, not for the local device.
    :param shape_limits: optional ``shape_limits(problem) -> None | reason``.
    :param description: one line for ``mqa providers``.
    :param distribution: the distribution it came from; filled in by discovery when left empty.
    :param version: that distribution's version; filled in by discovery when left empty.
    """

    name: str
    ops: frozenset[str]
    archs: frozenset[str]
    dtypes: frozenset[str]
    priority: int
    load: str
    check: RuntimeCheck | None = field(default=None, compare=False)
    shape_limits: ShapeLimits | None = field(default=None, compare=False)
    description: str = ""
    distribution: str = ""
    version: str = ""

    def __post_init__(self) -> None:
        # Accept any iterable for the set fields, store frozensets: specs hash and compare cleanly.
        for k in ("ops", "archs", "dtypes"):
            v = getattr(self, k)
            if isinstance(v, str):
                v = (v,)
            object.__setattr__(self, k, frozenset(v))
        errors = []
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            errors.append(f"name {self.name!r} must match {_NAME.pattern}")
        if not self.ops or not self.ops <= set(OPS):
            errors.append(f"ops {sorted(self.ops)} must be a non-empty subset of {list(OPS)}")
        unknown = self.archs - set(KNOWN_ARCHS) - {ANY_ARCH}
        if not self.archs or unknown:
            errors.append(f"archs {sorted(self.archs)} must be non-empty names from "
                          f"{list(KNOWN_ARCHS)} or {ANY_ARCH!r}")
        if not self.dtypes or not self.dtypes <= set(DTYPES):
            errors.append(f"dtypes {sorted(self.dtypes)} must be a non-empty subset of {list(DTYPES)}")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            errors.append(f"priority must be an int, got {self.priority!r}")
        if not isinstance(self.load, str) or not _LOAD.match(self.load):
            errors.append(f"load {self.load!r} must be 'package.module:attr'")
        for k in ("check", "shape_limits"):
            if getattr(self, k) is not None and not callable(getattr(self, k)):
                errors.append(f"{k} must be callable or None")
        if errors:
            raise ValueError(f"invalid ProviderSpec {self.name!r}: " + "; ".join(errors))

    def serves_arch(self, arch: str) -> bool:
        return ANY_ARCH in self.archs or arch in self.archs
