"""Launch a kernel again, for a call signature Triton has already compiled, without Triton's per-call work.

``kernel[grid](*args)`` (triton 3.6's ``JITFunction.run``) costs tens of microseconds on every call:
it binds the arguments and specialises each one (type, 16-byte alignment, == 1), hashes the result
into a cache key, looks the compiled kernel up, checks globals, builds launch metadata, and its Python
launcher wrapper encodes each TMA descriptor again. For a second call whose arguments specialise the
same way, every one of those answers is the same. So the first call of a signature goes through
Triton as usual and returns its ``CompiledKernel``; :class:`BoundKernel` keeps that kernel's C launch
function and constant arguments, and later calls hand their arguments to it directly.

Correctness rests on the caller's signature key: two calls may share a :class:`BoundKernel` only if
Triton would specialise their arguments identically (:func:`int_class` is what Triton reads from an
int). Tensor descriptors are encoded once per (data pointer, shape, strides): an encoded descriptor is
a pure function of those values, so a cached one can never point at another tensor.

Process-wide Triton settings that enter its cache key (``TRITON_DEBUG``, instrumentation) are read
when a signature is bound; changing them later in the process does not rebind.

Written against triton 3.6's internals (``CompiledKernel.run``, ``CudaLauncher``,
``wrap_handle_tensordesc``, ``make_tensordesc_arg``); :func:`direct_launch_unsupported` says why it
is off elsewhere (other triton versions, ROCm), where callers use the normal launch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from triton import knobs

__all__ = ["DIRECT_TRITON", "BoundKernel", "DirectLaunchUnavailable", "bind", "direct_launch_unsupported",
           "hooks_active", "int_class", "residues"]

#: triton releases whose launch internals this module was written and tested against.
DIRECT_TRITON = ("3.6.",)
#: Encoded descriptors kept per bound kernel: a model's layers each bring their own k (and the
#: allocator hands q the same few addresses), so a few hundred cover a repeated step. A miss costs
#: what every call cost before: building and encoding the descriptor.
_TMA_CACHE = 256


class DirectLaunchUnavailable(RuntimeError):
    """The compiled kernel cannot be launched directly (scratch memory, an unknown launcher shape)."""


@functools.cache
def direct_launch_unsupported(version: str | None = None) -> str | None:
    """None when direct launches can be used with the installed triton, else why not."""
    import torch

    if version is None:
        import triton

        version = triton.__version__
    if not version.startswith(DIRECT_TRITON):
        return (f"direct launches are written for triton {', '.join(v + 'x' for v in DIRECT_TRITON)}; "
                f"installed triton is {version}: kernels launch through triton's own path")
    if getattr(torch.version, "hip", None):
        return "direct launches are checked on NVIDIA only; ROCm launches through triton's own path"
    return None


def hooks_active() -> bool:
    """Whether a profiler has registered triton launch hooks (they need triton's own launch path)."""
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter) or getattr(leave, "calls", leave))


_MOD16 = (15).__and__


def residues(ptrs: tuple[int, ...]) -> tuple[int, ...] | None:
    """Each address modulo 16, or None when all are 0 (the common case, which a caller tests with one
    ``(p0 | p1 | ...) & 15`` instead of building this tuple per call): all a compiled kernel may assume
    of a pointer (Triton specialises on 16-byte alignment). A call prepared for one signature serves
    only addresses with its residues; others take the full launcher, which specialises anew."""
    found = tuple(map(_MOD16, ptrs))
    return found if any(found) else None


def int_class(v: int) -> int:
    """What Triton's specialisation of a non-constexpr int argument depends on: == 1 (then it is a
    compile-time constant), divisible by 16, and whether it needs 64 bits. Non-negative ``v`` only."""
    return (v == 1) | ((v & 15) == 0) << 1 | (v >> 31 != 0) << 2


def _unwrap(launch: Callable[..., Any], signature: dict[Any, Any]) -> tuple[Callable[..., Any], list[Any]]:
    """The C launch function under triton's descriptor-expanding wrapper, and the descriptor metadata
    (one entry per tensor-descriptor argument, None where the kernel takes base pointers)."""
    n_desc = sum(isinstance(s, str) and s.startswith("tensordesc") for s in signature.values())
    if not n_desc:
        return launch, []
    code, closure = getattr(launch, "__code__", None), getattr(launch, "__closure__", None)
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in closure))) if code and closure else {}
    raw, meta = cells.get("launcher"), cells.get("tensordesc_meta")
    if raw is None or "tensordesc_indices" not in cells:
        raise DirectLaunchUnavailable("triton's launcher has an unknown shape (no descriptor wrapper found)")
    meta = list(meta) if meta else [None] * n_desc
    if len(meta) != n_desc:
        raise DirectLaunchUnavailable(f"{len(meta)} descriptor layouts for {n_desc} descriptor arguments")
    return raw, meta


class BoundKernel:
    """One compiled kernel and its C launch function, bound for one call signature.

    ``bound(g0, g1, g2, stream, args)`` launches with ``args`` the kernel's parameters in order
    (constexpr ones included: the C launcher skips them), pointers as tensors or plain ints, and each
    tensor-descriptor parameter already expanded by :meth:`descriptor`.
    """

    __slots__ = ("compiled", "_launch", "_head", "_meta", "_tma")

    def __init__(self, compiled: Any) -> None:
        launcher = compiled.run  # loads the binary on the current device if not yet loaded
        if getattr(launcher, "global_scratch_size", 0) or getattr(launcher, "profile_scratch_size", 0):
            raise DirectLaunchUnavailable("the kernel needs scratch memory, which triton's launcher allocates")
        raw, meta = _unwrap(launcher.launch, compiled.src.signature)
        self.compiled = compiled
        self._launch = raw
        # After the grid and stream: function, cooperative, pdl, global and profile scratch, packed
        # metadata, launch metadata, enter hook, exit hook (the last three only feed profilers).
        self._head = (compiled.function, launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
                      compiled.packed_metadata, None, None, None)
        self._meta = meta
        self._tma: dict[tuple[Any, ...], list[Any]] = {}

    def __call__(self, g0: int, g1: int, g2: int, stream: int, args: tuple[Any, ...]) -> None:
        self._launch(g0, g1, g2, stream, *self._head, *args)

    def descriptor(self, key: tuple[Any, ...], make: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
        """The launcher arguments a tensor-descriptor parameter expands to. ``key`` = (descriptor
        number, 0 for the kernel's first; the tensor's data pointer, shape, strides: whatever
        identifies the descriptor ``make(*args)`` would build). Holds no tensor: base pointers become
        ints. (``make`` and its arguments, not a closure: the per-call path builds no function.)"""
        expanded = self._tma.get(key)
        return expanded if expanded is not None else self._expand(key, (make(*args),))

    def descriptors(self, key: tuple[Any, ...], make: Callable[..., tuple[Any, ...]], *args: Any) -> tuple[Any, ...]:
        """:meth:`descriptor` for consecutive descriptor parameters at once (``make(*args)`` builds them,
        the first is number ``key[0]``): one lookup for several views of one tensor (a page pool's
        values and scales). Key each tensor apart: one key over several tensors multiplies entries."""
        expanded = self._tma.get(key)
        return expanded if expanded is not None else self._expand(key, make(*args))

    def _expand(self, key: tuple[Any, ...], descs: tuple[Any, ...]) -> tuple[Any, ...]:
        from triton.backends.nvidia.driver import make_tensordesc_arg

        expanded = tuple(a.data_ptr() if hasattr(a, "data_ptr") else a
                         for i, desc in enumerate(descs) for a in make_tensordesc_arg(desc, self._meta[key[0] + i]))
        if len(self._tma) >= _TMA_CACHE:
            self._tma.pop(next(iter(self._tma)), None)
        self._tma[key] = expanded
        return expanded


def bind(compiled: Any) -> BoundKernel | bool:
    """A BoundKernel for what ``kernel[grid](...)`` returned, or False where it cannot be launched
    directly (callers then keep launching through Triton, and remember not to try again)."""
    if compiled is None or not hasattr(compiled, "packed_metadata"):
        return False  # a compile hook cancelled the launch, or an interpreter ran it
    try:
        return BoundKernel(compiled)
    except DirectLaunchUnavailable:
        return False
