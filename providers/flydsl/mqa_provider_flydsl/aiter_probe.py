"""Are AMD AITER's Triton/Gluon MQA-logits entries usable for an arch? Cheap, cached, never raises.

The ``aiter`` provider's check. It shares :func:`mqa_provider_flydsl.probe.installed` with the
``flydsl`` provider (which ``aiter`` is on disk: AMD's ``amd-aiter`` or the unrelated PyPI
async-iterator package of the same import name), then reads the entries' files, then imports AITER
at most once per discovery.

Read from ROCm/aiter (never copied), at ``e4048607a5`` (2026-08-22) unless said otherwise:

- prefill: ``aiter.ops.triton.attention.fp8_mqa_logits.fp8_mqa_logits(Q, KV, kv_scales, weights,
  cu_starts, cu_ends, clean_logits=True)``; the module moved there from ``aiter.ops.triton.
  fp8_mqa_logits`` in ROCm/aiter#1638 (``4c2a3025b6``, 2026-01-07; first added in #1296,
  ``9aeaf71ec7``). On gfx950 (and gfx1250) with triton >= 3.6 it runs the Gluon kernel of
  ROCm/aiter#3226 (``c69b84ef0b``), else the Triton kernel; on gfx942 the Triton kernel, after
  converting each e4m3fn operand to e4m3fnuz itself (values halved, ``kv_scales`` doubled).
- decode: ``aiter.ops.triton.attention.pa_mqa_logits.deepgemm_fp8_paged_mqa_logits(q_fp8, kv_cache,
  weights, out_logits, context_lens, kv_indices, max_model_len, Preshuffle=False, KVBlockSize=1,
  ChunkK=256, TotalCuCount=None, WavePerEU=2, VarCtxSchedule=None)`` (moved likewise from
  ``aiter.ops.triton.pa_mqa_logits``, first added in #1174, ``d36601a9d0``). With triton >= 3.5 it
  compiles a Gluon kernel for gfx942/gfx950/gfx1250: the non-preshuffled one pages per token
  (``KVBlockSize=1``: it reads ``kv_indices`` per position), the preshuffled one reads
  ``KVBlockSize``-token blocks (a multiple of 16) whose values are tiled 16 tokens x 16 bytes.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import probe
from .probe import _err

__all__ = ["ARCHS", "Entries", "check", "load_entries", "reset"]

#: The archs the provider declares (AITER also builds the kernels for gfx1250, not claimed here).
ARCHS = ("gfx942", "gfx950")
PREFILL = "fp8_mqa_logits"
PAGED = "deepgemm_fp8_paged_mqa_logits"
#: Where each entry lives, newest layout first (module, file relative to the ``aiter`` package).
PREFILL_AT = (("aiter.ops.triton.attention.fp8_mqa_logits", "ops/triton/attention/fp8_mqa_logits.py"),
              ("aiter.ops.triton.fp8_mqa_logits", "ops/triton/fp8_mqa_logits.py"))
PAGED_AT = (("aiter.ops.triton.attention.pa_mqa_logits", "ops/triton/attention/pa_mqa_logits.py"),
            ("aiter.ops.triton.pa_mqa_logits", "ops/triton/pa_mqa_logits.py"))


@dataclass(frozen=True)
class Entries:
    """AITER's two entries, and the keyword parameters the paged one takes (older builds lack
    ``KVBlockSize`` and ``Preshuffle``: per-token paging only)."""

    prefill: Callable[..., Any]
    paged: Callable[..., Any]
    paged_params: frozenset[str] = field(default_factory=frozenset)


def _has_file(location: str, candidates: tuple[tuple[str, str], ...], name: str) -> bool | None:
    """Whether a file of ``candidates`` under ``location`` defines ``def name``; None when the
    package has no files to read (a zip, a custom loader): the import decides."""
    if not os.path.isdir(location):
        return None
    for _, rel in candidates:
        try:
            with open(os.path.join(location, *rel.split("/")), encoding="utf-8", errors="replace") as f:
                if f"def {name}(" in f.read():
                    return True
        except OSError:
            continue
    return False


def _import(candidates: tuple[tuple[str, str], ...], name: str) -> tuple[Any, str | None]:
    errors = []
    for module_name, _ in candidates:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # this layout is not the installed one
            errors.append(f"{module_name}: {_err(exc)}")
            continue
        except (Exception, SystemExit) as exc:
            errors.append(f"{module_name}: {_err(exc)}")
            continue
        fn = getattr(module, name, None)
        if callable(fn):
            return fn, None
        errors.append(f"{module_name} has no function {name}")
    return None, "; ".join(errors) or f"no module of {', '.join(m for m, _ in candidates)} imports"


@functools.lru_cache(maxsize=1)
def load_entries() -> tuple[Entries | None, str | None]:
    """Import AITER's two entries once: ``(Entries, None)`` or ``(None, why not)``."""
    found = probe.installed()
    try:
        importlib.import_module("aiter")
    except (Exception, SystemExit) as exc:  # without ROCm it raises RuntimeError, OSError, ...
        return None, f"AMD AITER not importable: {_err(exc)}"
    prefill, why = _import(PREFILL_AT, PREFILL)
    if prefill is None:
        return None, f"{found.name}: AITER's Triton {PREFILL} does not import: {why}"
    paged, why = _import(PAGED_AT, PAGED)
    if paged is None:
        return None, f"{found.name}: AITER's {PAGED} does not import: {why}"
    try:
        params = frozenset(inspect.signature(paged).parameters)
    except (TypeError, ValueError):
        params = frozenset()
    return Entries(prefill, paged, params), None


@functools.cache
def _check(arch: str) -> str | None:
    if arch not in ARCHS:
        return f"AITER's Triton/Gluon MQA-logits kernels are declared here for {', '.join(ARCHS)}, not {arch}"
    found = probe.installed()
    if found.problem:
        return found.problem
    for candidates, name, pr in ((PREFILL_AT, PREFILL, "#1296"), (PAGED_AT, PAGED, "#1174")):
        if _has_file(found.location, candidates, name) is False:
            return (f"{found.name} has no aiter.ops.triton...{name} (added in ROCm/aiter{pr}); upgrade "
                    f"{probe.AMD_DIST}")
    entries, why = load_entries()
    if entries is None:
        return why
    return None


def check(arch: str) -> str | None:
    """The ``aiter`` spec's runtime check: None when AITER can run both entries for ``arch``, else why
    not. Answers for what is installed, never for the local device."""
    return probe.guarded("aiter", _check, arch)


def reset() -> None:
    """Forget cached answers (called at each discovery, with :func:`probe.reset`)."""
    load_entries.cache_clear()
    _check.cache_clear()
